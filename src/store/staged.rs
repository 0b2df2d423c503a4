//! Staged batches: the fast path of group commit.
//!
//! A batch of write requests is run in four steps inside one transaction:
//!
//! 1. **Lock** every existing resource the batch touches, in one statement,
//!    in a fixed (sorted) order — so two batches can never deadlock — and
//!    create the missing resources its acquires name (SQLite, whose write
//!    lock is already held, creates them first).
//! 2. **Load**, under those locks, everything the requests can read: the
//!    database clock, each resource's active lease, the leases the requests
//!    name by id or by token, and the fenced values they write.
//! 3. **Run** each request's operation — the same `ops::*_in` code as the
//!    one-request path — against [`StagedTx`], an in-memory view of the
//!    loaded rows that records every write. A request that fails is undone
//!    in memory alone; its batch-mates go on.
//! 4. **Flush** the recorded writes with multi-row statements (one on
//!    PostgreSQL, see [`BatchTx::flush`]) and commit.
//!
//! The round trips per batch no longer grow with the number of requests,
//! which is what lets one commit carry many of them. Anything the in-memory
//! view cannot answer with certainty (a read outside what was loaded) marks
//! the batch as *missed*; the caller then runs it again on the slow path,
//! request by request under savepoints, which handles every case.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;

use chrono::{DateTime, Utc};

use super::types::{NewEvent, ResourceRow, StoredValue};
use super::{ResourceTx, StoreError, StoreResult};
use crate::domain::{self, Lease, LeaseId, LeaseState, ResourceName, Token};

/// What a batch will touch, known before anything is locked.
#[derive(Debug, Default)]
pub struct Plan {
    /// Resources to create if missing (the batch's acquires).
    create: BTreeSet<ResourceName>,
    /// Resources to lock, a superset of `create`.
    lock: BTreeSet<ResourceName>,
    /// Leases named by id (renew, release).
    lease_ids: Vec<LeaseId>,
    /// Fenced checks and writes: the token each presents, by resource, and
    /// whether it writes the resource's fenced value.
    fences: Vec<(ResourceName, Token, bool)>,
}

impl Plan {
    pub fn acquire(&mut self, name: &ResourceName) {
        self.create.insert(name.clone());
        self.lock.insert(name.clone());
    }

    pub fn lease(&mut self, id: &LeaseId) {
        self.lease_ids.push(id.clone());
    }

    /// A request that only reads and writes `name`'s current lease
    /// (force-release, expiry).
    pub fn lock_only(&mut self, name: &ResourceName) {
        self.lock.insert(name.clone());
    }

    pub fn fence(&mut self, name: &ResourceName, token: Token, writes_value: bool) {
        self.lock.insert(name.clone());
        self.fences.push((name.clone(), token, writes_value));
    }
}

/// The writes a batch made, each row in its final state, ready to flush.
#[derive(Debug, Default)]
pub struct Changes {
    pub resources: Vec<ResourceRow>,
    /// Leases that existed before the batch.
    pub updated_leases: Vec<Lease>,
    /// Leases the batch created (written after the updates, so an expiry
    /// and the grant that follows it never trip the one-active-lease index).
    pub new_leases: Vec<Lease>,
    pub values: Vec<(ResourceName, StoredValue)>,
    /// In the order they happened.
    pub events: Vec<NewEvent>,
    /// Resources whose lease ended (announced to other instances).
    pub ended: Vec<ResourceName>,
    /// Resources the batch created that no request ended up using.
    pub unused: Vec<ResourceName>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
            && self.updated_leases.is_empty()
            && self.new_leases.is_empty()
            && self.values.is_empty()
            && self.events.is_empty()
            && self.unused.is_empty()
    }
}

/// The batch primitives each backend supplies, as multi-row statements: a
/// batch costs a few round trips (PostgreSQL) or worker-thread hand-offs
/// (SQLite) whatever its size.
pub trait BatchTx: ResourceTx {
    /// Locks, in sorted order, every existing resource of `lock` and the
    /// resource of every lease in `lease_ids` (found before locking: a
    /// lease never moves between resources), and creates the resources of
    /// `create` that are missing. Returns the locked rows (created ones
    /// included) and the names this call created.
    fn lock_resources(
        &mut self,
        create: &[ResourceName],
        lock: &[ResourceName],
        lease_ids: &[LeaseId],
    ) -> impl Future<Output = StoreResult<(Vec<ResourceRow>, Vec<ResourceName>)>> + Send;

    /// Deletes resources a batch created but left unused (every request on
    /// them failed), so a failed request leaves nothing behind.
    fn delete_resources(
        &mut self,
        names: &[ResourceName],
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// The database clock (read after every lock is held), the active
    /// leases of `names`, the leases with the given ids, and the leases with
    /// the given (resource, token) pairs.
    fn load_leases(
        &mut self,
        names: &[ResourceName],
        ids: &[LeaseId],
        tokens: &[(ResourceName, Token)],
    ) -> impl Future<Output = StoreResult<(DateTime<Utc>, Vec<Lease>)>> + Send;

    /// The fenced values of `names` that exist (by default one read per
    /// name: batches write few values).
    fn load_values(
        &mut self,
        names: &[ResourceName],
    ) -> impl Future<Output = StoreResult<Vec<(ResourceName, StoredValue)>>> + Send {
        async move {
            let mut values = Vec::new();
            for name in names {
                if let Some(value) = self.value(name).await? {
                    values.push((name.clone(), value));
                }
            }
            Ok(values)
        }
    }

    /// Everything a batch reads once its locks are held: the clock and
    /// leases of [`Self::load_leases`], and the fenced values of `values`
    /// (by default two reads; a backend with round trips to save does it in
    /// one).
    fn load(
        &mut self,
        names: &[ResourceName],
        ids: &[LeaseId],
        tokens: &[(ResourceName, Token)],
        values: &[ResourceName],
    ) -> impl Future<Output = StoreResult<Loaded>> + Send {
        async move {
            let (now, leases) = self.load_leases(names, ids, tokens).await?;
            let values = if values.is_empty() {
                Vec::new()
            } else {
                self.load_values(values).await?
            };
            Ok(Loaded {
                now,
                leases,
                values,
            })
        }
    }

    /// Writes `changes` (see [`Changes`] for the order that matters).
    fn flush(&mut self, changes: &Changes) -> impl Future<Output = StoreResult<()>> + Send;
}

/// What [`BatchTx::load`] read.
pub struct Loaded {
    pub now: DateTime<Utc>,
    pub leases: Vec<Lease>,
    pub values: Vec<(ResourceName, StoredValue)>,
}

/// What a batch loads once its locks are held, worked out from the locked
/// rows: the resources whose active lease it knows, the (resource, token)
/// pairs whose lease (or its absence) it knows, and the fenced values it
/// reads.
#[derive(Debug, PartialEq, Eq)]
pub struct AfterLock {
    /// Sorted, without duplicates.
    pub lock: Vec<ResourceName>,
    /// Sorted, without duplicates.
    pub tokens: Vec<(ResourceName, Token)>,
    /// Sorted, without duplicates.
    pub values: Vec<ResourceName>,
}

impl AfterLock {
    /// `lock` and `fences` as planned; `rows` and `created` as the lock
    /// returned them.
    pub fn new(
        lock: &[ResourceName],
        fences: &[(ResourceName, Token, bool)],
        rows: &[ResourceRow],
        created: &[ResourceName],
    ) -> Self {
        let mut locked: BTreeSet<ResourceName> = lock.iter().cloned().collect();
        locked.extend(rows.iter().map(|r| r.name.clone()));
        let resources: HashMap<&ResourceName, &ResourceRow> =
            rows.iter().map(|r| (&r.name, r)).collect();
        // A fence reads the lease of its own token and, when it refuses,
        // the lease of the token that fenced it out.
        let mut tokens = BTreeSet::new();
        for (name, token, _) in fences {
            tokens.insert((name.clone(), token.get()));
            if let Some(row) = resources.get(name) {
                for t in [row.accepted_token, row.last_token] {
                    if t > 0 {
                        tokens.insert((name.clone(), t));
                    }
                }
            }
        }
        // A value is read only where a write could be accepted: a refused
        // write never touches it, and a token refused now stays refused.
        // Resources created by this batch (or without a row) are read as
        // before: their first token is issued in the batch. Should a request
        // in this batch raise an existing resource's last token and a write
        // present the new token, the value is missing and the batch is rerun
        // the slow way (see `miss`).
        let values: BTreeSet<ResourceName> = fences
            .iter()
            .filter(|(name, token, writes)| {
                *writes
                    && (created.contains(name)
                        || resources.get(name).is_none_or(|row| {
                            domain::may_accept(*token, row.last_token, row.accepted_token)
                        }))
            })
            .map(|(name, _, _)| name.clone())
            .collect();
        Self {
            lock: locked.into_iter().collect(),
            tokens: tokens
                .into_iter()
                .map(|(n, t)| (n, Token::from_stored(t)))
                .collect(),
            values: values.into_iter().collect(),
        }
    }
}

/// A row and whether the batch changed it.
#[derive(Debug, Clone)]
struct Slot<T> {
    row: T,
    dirty: bool,
}

/// What a savepoint needs to undo one entry.
enum Undo {
    Resource(ResourceName, Option<Slot<ResourceRow>>),
    Lease(LeaseId, Option<Slot<Lease>>),
    Value(ResourceName, Option<Slot<Option<StoredValue>>>),
}

struct Savepoint {
    undo: Vec<Undo>,
    events: usize,
    ended: usize,
}

/// The loaded rows of one batch, read and written in memory.
pub struct StagedTx {
    now: DateTime<Utc>,
    /// Resources locked by this batch: their rows (if they exist) and active
    /// leases are known.
    locked: HashSet<ResourceName>,
    resources: HashMap<ResourceName, Slot<ResourceRow>>,
    /// Resources this batch created.
    created: Vec<ResourceName>,
    leases: HashMap<LeaseId, Slot<Lease>>,
    /// Leases that existed before the batch (the rest are new).
    existing: HashSet<LeaseId>,
    /// Lease ids whose presence or absence was loaded.
    known_ids: HashSet<LeaseId>,
    /// (resource, token) pairs whose lease, or its absence, was loaded.
    known_tokens: HashSet<(ResourceName, i64)>,
    values: HashMap<ResourceName, Slot<Option<StoredValue>>>,
    events: Vec<NewEvent>,
    ended: Vec<ResourceName>,
    savepoint: Option<Savepoint>,
    missed: Option<String>,
}

impl StagedTx {
    /// Locks and loads everything `plan` can touch, inside `tx`.
    pub async fn load<T: BatchTx>(tx: &mut T, plan: Plan) -> StoreResult<Self> {
        let create: Vec<ResourceName> = plan.create.into_iter().collect();
        let lock: Vec<ResourceName> = plan.lock.iter().cloned().collect();
        let (rows, created) = tx.lock_resources(&create, &lock, &plan.lease_ids).await?;
        let after = AfterLock::new(&lock, &plan.fences, &rows, &created);
        let Loaded {
            now,
            leases,
            values: loaded_values,
        } = tx
            .load(&after.lock, &plan.lease_ids, &after.tokens, &after.values)
            .await?;
        let resources: HashMap<ResourceName, ResourceRow> =
            rows.into_iter().map(|r| (r.name.clone(), r)).collect();
        let locked: HashSet<ResourceName> = after.lock.into_iter().collect();
        let mut values: HashMap<ResourceName, Slot<Option<StoredValue>>> =
            after.values.into_iter().map(|n| (n, clean(None))).collect();
        for (name, value) in loaded_values {
            values.insert(name, clean(Some(value)));
        }
        let tokens = after.tokens.into_iter().map(|(n, t)| (n, t.get()));
        let existing: HashSet<LeaseId> = leases.iter().map(|l| l.lease_id.clone()).collect();
        let mut staged = Self {
            now,
            resources: resources.into_iter().map(|(n, r)| (n, clean(r))).collect(),
            created,
            leases: leases
                .into_iter()
                .map(|l| (l.lease_id.clone(), clean(l)))
                .collect(),
            existing,
            known_ids: plan.lease_ids.into_iter().collect(),
            known_tokens: tokens.collect(),
            values,
            locked,
            events: Vec::new(),
            ended: Vec::new(),
            savepoint: None,
            missed: None,
        };
        // A lease read by id whose resource was not locked (it appeared
        // between the lookup and the lock) cannot be trusted here.
        let unlocked = staged
            .leases
            .values()
            .find(|s| !staged.locked.contains(&s.row.resource))
            .map(|s| s.row.resource.clone());
        if let Some(name) = unlocked {
            staged.miss(format!("lease on unlocked resource {name:?}"));
        }
        Ok(staged)
    }

    /// Why the batch must be run again on the slow path, if it must.
    pub fn missed(&self) -> Option<&str> {
        self.missed.as_deref()
    }

    /// The recorded writes, each row in its final state.
    pub fn into_changes(self) -> Changes {
        let mut changes = Changes {
            events: self.events,
            ended: self.ended,
            ..Changes::default()
        };
        // A created resource is saved by the acquire that created it, unless
        // that acquire failed and was undone.
        changes.unused = self
            .created
            .iter()
            .filter(|n| !self.resources.get(*n).is_some_and(|s| s.dirty))
            .cloned()
            .collect();
        let mut resources: Vec<ResourceRow> = self
            .resources
            .into_values()
            .filter(|s| s.dirty)
            .map(|s| s.row)
            .collect();
        resources.sort_by(|a, b| a.name.cmp(&b.name));
        changes.resources = resources;
        for slot in self.leases.into_values().filter(|s| s.dirty) {
            if self.existing.contains(&slot.row.lease_id) {
                changes.updated_leases.push(slot.row);
            } else {
                changes.new_leases.push(slot.row);
            }
        }
        changes
            .updated_leases
            .sort_by(|a, b| a.lease_id.as_str().cmp(b.lease_id.as_str()));
        changes
            .new_leases
            .sort_by(|a, b| a.lease_id.as_str().cmp(b.lease_id.as_str()));
        for (name, slot) in self.values {
            if let (true, Some(value)) = (slot.dirty, slot.row) {
                changes.values.push((name, value));
            }
        }
        changes.values.sort_by(|a, b| a.0.cmp(&b.0));
        changes.ended.sort();
        changes.ended.dedup();
        changes
    }

    fn miss(&mut self, why: String) -> StoreError {
        let err = StoreError::Unavailable(format!("staged batch cannot answer: {why}"));
        self.missed.get_or_insert(why);
        err
    }

    fn journal(&mut self, undo: impl FnOnce(&Self) -> Undo) {
        if self.savepoint.is_some() {
            let entry = undo(self);
            if let Some(sp) = self.savepoint.as_mut() {
                sp.undo.push(entry);
            }
        }
    }

    fn require_locked(&mut self, name: &ResourceName) -> StoreResult<()> {
        if self.locked.contains(name) {
            Ok(())
        } else {
            Err(self.miss(format!("resource {name:?} was not locked")))
        }
    }
}

fn clean<T>(row: T) -> Slot<T> {
    Slot { row, dirty: false }
}

fn dirty<T>(row: T) -> Slot<T> {
    Slot { row, dirty: true }
}

impl ResourceTx for StagedTx {
    async fn now(&mut self) -> StoreResult<DateTime<Utc>> {
        Ok(self.now)
    }

    async fn ensure_resource(&mut self, name: &ResourceName) -> StoreResult<()> {
        self.require_locked(name)?;
        if self.resources.contains_key(name) {
            Ok(())
        } else {
            Err(self.miss(format!("resource {name:?} was not created")))
        }
    }

    async fn resource(
        &mut self,
        name: &ResourceName,
        _for_update: bool,
    ) -> StoreResult<Option<ResourceRow>> {
        self.require_locked(name)?;
        Ok(self.resources.get(name).map(|s| s.row.clone()))
    }

    async fn save_resource(&mut self, row: &ResourceRow) -> StoreResult<()> {
        self.require_locked(&row.name)?;
        if !self.resources.contains_key(&row.name) {
            return Err(self.miss(format!("saving unknown resource {:?}", row.name)));
        }
        let name = row.name.clone();
        self.journal(|s| Undo::Resource(name.clone(), s.resources.get(&name).cloned()));
        self.resources.insert(row.name.clone(), dirty(row.clone()));
        Ok(())
    }

    async fn active_lease(&mut self, name: &ResourceName) -> StoreResult<Option<Lease>> {
        self.require_locked(name)?;
        let mut active = self
            .leases
            .values()
            .filter(|s| &s.row.resource == name && s.row.state == LeaseState::Active);
        let first = active.next().map(|s| s.row.clone());
        if active.next().is_some() {
            return Err(StoreError::Corrupt(format!(
                "two active leases on {name:?}"
            )));
        }
        Ok(first)
    }

    async fn lease_by_id(&mut self, id: &LeaseId) -> StoreResult<Option<Lease>> {
        if let Some(slot) = self.leases.get(id) {
            return Ok(Some(slot.row.clone()));
        }
        if self.known_ids.contains(id) {
            Ok(None)
        } else {
            Err(self.miss("lease read by an id that was not loaded".into()))
        }
    }

    async fn lease_by_token(
        &mut self,
        name: &ResourceName,
        token: Token,
    ) -> StoreResult<Option<Lease>> {
        let found = self
            .leases
            .values()
            .find(|s| &s.row.resource == name && s.row.token == token)
            .map(|s| s.row.clone());
        if found.is_some() || self.known_tokens.contains(&(name.clone(), token.get())) {
            Ok(found)
        } else {
            Err(self.miss(format!("lease {token} of {name:?} was not loaded")))
        }
    }

    async fn insert_lease(&mut self, lease: &Lease) -> StoreResult<()> {
        self.require_locked(&lease.resource)?;
        if self.leases.contains_key(&lease.lease_id) {
            return Err(StoreError::Conflict("lease id already exists".into()));
        }
        let id = lease.lease_id.clone();
        self.journal(|_| Undo::Lease(id, None));
        self.leases
            .insert(lease.lease_id.clone(), dirty(lease.clone()));
        Ok(())
    }

    async fn update_lease(&mut self, lease: &Lease) -> StoreResult<()> {
        self.require_locked(&lease.resource)?;
        if !self.leases.contains_key(&lease.lease_id) {
            return Err(self.miss("updating a lease that was not loaded".into()));
        }
        let id = lease.lease_id.clone();
        self.journal(|s| Undo::Lease(id.clone(), s.leases.get(&id).cloned()));
        self.leases
            .insert(lease.lease_id.clone(), dirty(lease.clone()));
        Ok(())
    }

    async fn upsert_value(
        &mut self,
        name: &ResourceName,
        json: &str,
        token: Token,
        now: DateTime<Utc>,
    ) -> StoreResult<i64> {
        let Some(slot) = self.values.get(name) else {
            return Err(self.miss(format!("value of {name:?} was not loaded")));
        };
        let version = slot.row.as_ref().map_or(1, |v| v.version + 1);
        let key = name.clone();
        self.journal(|s| Undo::Value(key.clone(), s.values.get(&key).cloned()));
        let value = StoredValue {
            json: json.to_owned(),
            token,
            version,
            updated_at: now,
        };
        self.values.insert(name.clone(), dirty(Some(value)));
        Ok(version)
    }

    async fn value(&mut self, name: &ResourceName) -> StoreResult<Option<StoredValue>> {
        match self.values.get(name) {
            Some(slot) => Ok(slot.row.clone()),
            None => Err(self.miss(format!("value of {name:?} was not loaded"))),
        }
    }

    async fn insert_event(&mut self, event: &NewEvent) -> StoreResult<()> {
        self.events.push(event.clone());
        Ok(())
    }

    async fn announce_lease_ended(&mut self, name: &ResourceName) -> StoreResult<()> {
        self.ended.push(name.clone());
        Ok(())
    }

    async fn savepoint(&mut self) -> StoreResult<()> {
        self.savepoint = Some(Savepoint {
            undo: Vec::new(),
            events: self.events.len(),
            ended: self.ended.len(),
        });
        Ok(())
    }

    async fn release_savepoint(&mut self) -> StoreResult<()> {
        self.savepoint = None;
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self) -> StoreResult<()> {
        let Some(sp) = self.savepoint.take() else {
            return Err(StoreError::Corrupt("no savepoint to roll back to".into()));
        };
        for undo in sp.undo.into_iter().rev() {
            match undo {
                Undo::Resource(name, Some(slot)) => {
                    self.resources.insert(name, slot);
                }
                Undo::Resource(name, None) => {
                    self.resources.remove(&name);
                }
                Undo::Lease(id, Some(slot)) => {
                    self.leases.insert(id, slot);
                }
                Undo::Lease(id, None) => {
                    self.leases.remove(&id);
                }
                Undo::Value(name, Some(slot)) => {
                    self.values.insert(name, slot);
                }
                Undo::Value(name, None) => {
                    self.values.remove(&name);
                }
            }
        }
        self.events.truncate(sp.events);
        self.ended.truncate(sp.ended);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    fn name(s: &str) -> ResourceName {
        ResourceName::parse(s).expect("name")
    }

    fn row(s: &str, last_token: i64, accepted_token: i64) -> ResourceRow {
        ResourceRow {
            name: name(s),
            last_token,
            accepted_token,
            created_at: Utc::now(),
            last_activity_at: Utc::now(),
        }
    }

    fn token(t: i64) -> Token {
        Token::from_stored(t)
    }

    #[test]
    fn after_a_lock_a_batch_reads_the_fences_tokens_and_the_values_it_may_write() {
        let lock = [name("a"), name("b"), name("c"), name("new")];
        let fences = [
            // Superseded but newer than the accepted token: may be accepted.
            (name("a"), token(2), true),
            // Older than the accepted token: refused, so no value is read.
            (name("b"), token(1), true),
            // A check without a write: tokens only.
            (name("c"), token(4), false),
            // Created by this batch: its value is read.
            (name("new"), token(1), true),
        ];
        let rows = [
            row("a", 3, 1),
            row("b", 5, 4),
            row("c", 4, 0),
            row("new", 0, 0),
            // The resource of a lease named by id.
            row("by-id", 7, 7),
        ];
        let after = AfterLock::new(&lock, &fences, &rows, &[name("new")]);
        assert_eq!(
            after.lock,
            vec![name("a"), name("b"), name("by-id"), name("c"), name("new")]
        );
        let tokens: Vec<(&str, i64)> = after
            .tokens
            .iter()
            .map(|(n, t)| (n.as_str(), t.get()))
            .collect();
        assert_eq!(
            tokens,
            vec![
                ("a", 1),
                ("a", 2),
                ("a", 3),
                ("b", 1),
                ("b", 4),
                ("b", 5),
                ("c", 4),
                ("new", 1),
            ]
        );
        assert_eq!(after.values, vec![name("a"), name("new")]);
    }

    #[test]
    fn two_fences_on_one_resource_read_its_value_once() {
        let lock = [name("a")];
        let fences = [
            (name("a"), token(3), true),
            (name("a"), token(3), true),
            (name("a"), token(2), false),
        ];
        let after = AfterLock::new(&lock, &fences, &[row("a", 3, 2)], &[]);
        assert_eq!(after.lock, vec![name("a")]);
        assert_eq!(
            after.tokens,
            vec![(name("a"), token(2)), (name("a"), token(3))]
        );
        assert_eq!(after.values, vec![name("a")]);
    }

    #[test]
    fn a_token_the_resource_never_issued_reads_no_value() {
        // Token 9 is above the last issued token 4: the write is refused as
        // unknown, so its value is not read (the resource was not created
        // by this batch).
        let lock = [name("a")];
        let fences = [(name("a"), token(9), true)];
        let after = AfterLock::new(&lock, &fences, &[row("a", 4, 4)], &[]);
        assert_eq!(
            after.tokens,
            vec![(name("a"), token(4)), (name("a"), token(9))]
        );
        assert!(after.values.is_empty());
    }

    #[test]
    fn a_fence_on_a_resource_without_a_row_reads_only_its_own_token() {
        let lock = [name("gone")];
        let fences = [(name("gone"), token(3), true)];
        let after = AfterLock::new(&lock, &fences, &[], &[]);
        assert_eq!(after.lock, vec![name("gone")]);
        assert_eq!(after.tokens, vec![(name("gone"), token(3))]);
        assert_eq!(after.values, vec![name("gone")]);
    }
}
