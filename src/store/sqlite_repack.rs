//! `palisade repack`: rewrites an existing SQLite database with another
//! page size.
//!
//! New databases get 1 KiB pages ([`super::sqlite::NEW_DATABASE_PAGE_SIZE`]);
//! a file created before that keeps the page size it was made with, because
//! WAL mode cannot change it. Repacking switches the file to a rollback
//! journal (which checkpoints the WAL into it), rebuilds it with `VACUUM` at
//! the new size and switches it back to WAL. It needs the file to itself: a
//! running server holds connections open, and the switch out of WAL mode is
//! refused while any other connection exists, so repacking a database in use
//! fails before anything changes. `VACUUM` builds the new file in the
//! temporary directory and copies it back through a rollback journal beside
//! the file, so it needs up to twice the file's size in free disk space.

use std::path::PathBuf;
use std::str::FromStr;

use rusqlite::{Connection, ErrorCode};
use sqlx::sqlite::SqliteConnectOptions;

use super::sqlite::{IS_PALISADE_SCHEMA, is_in_memory};
use super::sqlite_writer::open_existing;
use super::{StoreError, StoreResult, is_postgres_url};

/// How long repacking waits for a lock before calling the database in use.
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A database file's page size and page count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLayout {
    pub page_size: u32,
    pub pages: u64,
}

impl PageLayout {
    pub fn bytes(&self) -> u64 {
        u64::from(self.page_size) * self.pages
    }
}

/// What `repack` found and left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repacked {
    pub path: PathBuf,
    pub before: PageLayout,
    pub after: PageLayout,
}

impl Repacked {
    /// False when the file already had the page size asked for (it was
    /// left untouched).
    pub fn changed(&self) -> bool {
        self.before.page_size != self.after.page_size
    }
}

/// SQLite's page sizes: powers of two from 512 to 65,536 bytes.
pub fn valid_page_size(size: u32) -> bool {
    (512..=65_536).contains(&size) && size.is_power_of_two()
}

/// The file a `sqlite://…` URL names; other URLs are refused.
fn database_path(url: &str) -> StoreResult<PathBuf> {
    if is_postgres_url(url) {
        return Err(StoreError::InvalidData(
            "repack rewrites SQLite files; a PostgreSQL database needs none".into(),
        ));
    }
    if !url.starts_with("sqlite:") {
        return Err(StoreError::InvalidData(format!(
            "unsupported database URL {url:?}: use sqlite://PATH"
        )));
    }
    if is_in_memory(url) {
        return Err(StoreError::InvalidData(
            "an in-memory database has no file to repack".into(),
        ));
    }
    let options = SqliteConnectOptions::from_str(url)
        .map_err(|e| StoreError::InvalidData(format!("bad SQLite URL: {e}")))?;
    Ok(options.get_filename().to_owned())
}

fn layout(conn: &Connection) -> StoreResult<PageLayout> {
    let page_size = conn.query_row("PRAGMA page_size", [], |row| row.get(0))?;
    let pages = conn.query_row("PRAGMA page_count", [], |row| row.get(0))?;
    Ok(PageLayout { page_size, pages })
}

/// Sets the journal mode and checks that SQLite took it: it answers with
/// the mode in force, which stays `wal` when it cannot leave WAL mode.
fn journal_mode(conn: &Connection, mode: &str) -> StoreResult<()> {
    let now: String = conn
        .query_row(&format!("PRAGMA journal_mode = {mode}"), [], |row| {
            row.get(0)
        })
        .map_err(in_use)?;
    if now.eq_ignore_ascii_case(mode) {
        Ok(())
    } else {
        Err(StoreError::Unavailable(format!(
            "SQLite kept journal mode {now} instead of {mode}: is the database in use? \
             Stop the server first"
        )))
    }
}

/// SQLITE_BUSY, said the way an operator needs to hear it.
fn in_use(err: rusqlite::Error) -> StoreError {
    if err.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) {
        StoreError::Unavailable(
            "the database is in use (is a server running on it?): stop it first".into(),
        )
    } else {
        err.into()
    }
}

/// Rewrites the database at `url` with pages of `page_size` bytes, or
/// leaves it alone if it already has them.
pub fn repack(url: &str, page_size: u32) -> StoreResult<Repacked> {
    if !valid_page_size(page_size) {
        return Err(StoreError::InvalidData(format!(
            "page size {page_size} is not one SQLite supports: a power of two from 512 to 65536"
        )));
    }
    let path = database_path(url)?;
    if !path.is_file() {
        return Err(StoreError::InvalidData(format!(
            "no database file at {}",
            path.display()
        )));
    }
    // Never creates the file. Waits a little for locks (a server that has
    // just stopped may still be closing its connections), then calls the
    // database in use.
    let conn = open_existing(&path)?;
    conn.busy_timeout(BUSY_WAIT)?;
    // Every lock this connection takes is held until it closes: once it has
    // the file to itself (leaving WAL mode takes an exclusive lock), nobody
    // can open it between the steps below.
    conn.execute_batch("PRAGMA locking_mode = EXCLUSIVE;")?;
    let palisade: bool = conn
        .query_row(IS_PALISADE_SCHEMA, [], |row| row.get(0))
        .map_err(in_use)?;
    if !palisade {
        return Err(StoreError::InvalidData(format!(
            "{} is not a Palisade database",
            path.display()
        )));
    }
    let before = layout(&conn)?;
    if before.page_size == page_size {
        return Ok(Repacked {
            path,
            before,
            after: before,
        });
    }
    journal_mode(&conn, "delete")?;
    let rebuilt = conn
        .execute_batch(&format!("PRAGMA page_size = {page_size}; VACUUM;"))
        .map_err(in_use);
    // Back to WAL whatever VACUUM did: a failed VACUUM changed nothing.
    match (rebuilt, journal_mode(&conn, "wal")) {
        (Ok(()), Ok(())) => {}
        (Err(err), Ok(())) | (Ok(()), Err(err)) => return Err(err),
        (Err(vacuum), Err(wal)) => {
            return Err(StoreError::Unavailable(format!(
                "{vacuum}; then switching back to WAL failed too ({wal}): the file is unchanged \
                 but in rollback-journal mode until `palisade serve` opens it (which switches \
                 it back)"
            )));
        }
    }
    let after = layout(&conn)?;
    if after.page_size != page_size {
        return Err(StoreError::Unavailable(format!(
            "SQLite kept {}-byte pages after VACUUM",
            after.page_size
        )));
    }
    Ok(Repacked {
        path,
        before,
        after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_sizes_are_powers_of_two_from_512_to_64_kib() {
        for ok in [512, 1024, 4096, 65_536] {
            assert!(valid_page_size(ok), "{ok}");
        }
        for bad in [0, 256, 1000, 3072, 131_072] {
            assert!(!valid_page_size(bad), "{bad}");
        }
    }

    #[test]
    fn only_sqlite_files_can_be_repacked() {
        for url in [
            "postgres://postgres@127.0.0.1/test",
            "mysql://x",
            "sqlite::memory:",
            "sqlite://shared.db?mode=memory&cache=shared",
        ] {
            assert!(
                matches!(database_path(url), Err(StoreError::InvalidData(_))),
                "{url}"
            );
        }
        assert_eq!(
            database_path("sqlite://data/palisade.db").expect("a file"),
            PathBuf::from("data/palisade.db")
        );
    }

    #[test]
    fn a_file_that_is_not_palisades_is_left_alone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("other.db");
        let conn = Connection::open(&path).expect("open");
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .expect("create");
        let before = layout(&conn).expect("layout");
        drop(conn);
        let url = format!("sqlite://{}", path.display());
        let err = repack(&url, 8192).expect_err("not a Palisade database");
        assert!(err.to_string().contains("not a Palisade database"), "{err}");
        let conn = Connection::open(&path).expect("open");
        assert_eq!(layout(&conn).expect("layout"), before);
    }

    #[test]
    fn a_missing_file_is_not_created() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("missing.db");
        let url = format!("sqlite://{}", path.display());
        assert!(matches!(
            repack(&url, 1024),
            Err(StoreError::InvalidData(_))
        ));
        assert!(!path.exists());
    }
}
