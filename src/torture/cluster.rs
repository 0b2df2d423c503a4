//! The processes a torture run owns: a private PostgreSQL cluster and the
//! Palisade instances, each restartable, all cleaned up on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio_util::sync::CancellationToken;

/// Sends a signal by name (`KILL`, `STOP`, `CONT`, `TERM`) to `pid`.
pub fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The directory holding initdb and pg_ctl: `PALISADE_PG_BINDIR`, else the
/// newest /usr/lib/postgresql/*/bin, else whatever is on PATH.
fn pg_bindir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("PALISADE_PG_BINDIR") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("pg_ctl").exists())
        .collect();
    versions.sort();
    versions.pop()
}

/// A PostgreSQL cluster of our own on a random loopback port.
pub struct PgCluster {
    data: PathBuf,
    bindir: Option<PathBuf>,
    pub port: u16,
    as_postgres: bool,
}

impl PgCluster {
    pub fn create(base: &Path, port: u16) -> anyhow::Result<Self> {
        let data = base.join("pgdata");
        std::fs::create_dir_all(&data)?;
        let as_postgres = is_root();
        if as_postgres {
            // PostgreSQL refuses to run as root: hand the directory over.
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(base))?;
        }
        let cluster = Self {
            data,
            bindir: pg_bindir(),
            port,
            as_postgres,
        };
        run(cluster
            .command("initdb")
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-D"])
            .arg(&cluster.data))
        .context("initdb failed (is PostgreSQL installed?)")?;
        Ok(cluster)
    }

    fn command(&self, tool: &str) -> Command {
        let program = self
            .bindir
            .as_ref()
            .map_or_else(|| PathBuf::from(tool), |d| d.join(tool));
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        cmd
    }

    pub fn start(&self) -> anyhow::Result<()> {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c max_connections=200 -c fsync=on",
            self.port,
            self.data.display()
        );
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.data.join("server.log"))
            .args(["-w", "-t", "60", "-o", &options, "start"]))
    }

    /// A crash: every server process quits at once, without a checkpoint;
    /// the next start runs crash recovery.
    pub fn crash(&self) -> anyhow::Result<()> {
        run(self.command("pg_ctl").arg("-D").arg(&self.data).args([
            "-m",
            "immediate",
            "-w",
            "stop",
        ]))
    }

    pub fn stop(&self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "stop"])
            .status();
    }

    pub fn url(&self, port: u16, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/{db}")
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// A Palisade instance kept running by a supervisor: when it dies (a kill,
/// or a start while the database is down) it is started again.
#[derive(Clone)]
pub struct Instance {
    pub name: String,
    pub base: String,
    pid: Arc<Mutex<Option<u32>>>,
}

impl Instance {
    pub fn pid(&self) -> Option<u32> {
        *self.pid.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn spawn_supervised(
        name: String,
        port: u16,
        database_url: String,
        log: PathBuf,
        stop: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let instance = Instance {
            name,
            base: format!("http://127.0.0.1:{port}"),
            pid: Arc::new(Mutex::new(None)),
        };
        let me = instance.clone();
        let task = tokio::spawn(async move {
            let Ok(exe) = std::env::current_exe() else {
                return;
            };
            while !stop.is_cancelled() {
                let stderr = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log);
                let mut cmd = tokio::process::Command::new(&exe);
                cmd.args([
                    "serve",
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                    "--database-url",
                    &database_url,
                ])
                .args(["--admin-token", "torture", "--sweep-interval-ms", "100"])
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .kill_on_drop(true);
                if let Ok(file) = stderr {
                    cmd.stderr(file);
                }
                let Ok(mut child) = cmd.spawn() else { return };
                *me.pid.lock().unwrap_or_else(|p| p.into_inner()) = child.id();
                tokio::select! {
                    _ = child.wait() => {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    () = stop.cancelled() => {
                        if let Some(pid) = child.id() {
                            signal(pid, "CONT");
                            signal(pid, "TERM");
                        }
                        if tokio::time::timeout(Duration::from_secs(20), child.wait()).await.is_err() {
                            let _ = child.kill().await;
                        }
                    }
                }
            }
        });
        (instance, task)
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(
        &self,
        client: &reqwest::Client,
        within: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(res) = client.get(format!("{}/readyz", self.base)).send().await {
                if res.status().is_success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("{} did not become ready", self.name);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A free loopback port (bound and released; the small race is acceptable
/// for a test harness).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
