//! The per-job journal: what each layer intends to make, recorded before it is made, and what it
//! made, recorded after. Teardown (epilog, reconcile) works from the journal alone, so every
//! intent holds everything needed to find and undo its resource even if the config changed.
//!
//! Writes are atomic: a temporary file, then a rename over the journal (an exchange, so the old
//! file can be recycled). Intents, which must be on disk before anything they announce is made,
//! are also written into the node's intent log and synced there ([`crate::intent_log`]: one
//! write and one flush; the journal file itself is fsynced with its folder only when the log
//! cannot take them); the final result is not synced (every layer undoes from its intent alone).

use chrono::{DateTime, Utc};
use rustix::fs::RenameFlags;
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::intent_log::{self, Flushing, IntentLog};

pub const VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepState {
    /// Recorded before the layer acts: the resource may or may not exist.
    Intended,
    /// The layer reported success; `made` says what exists.
    Made,
    /// Torn down.
    Undone,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub layer: String,
    pub state: StepState,
    pub intent: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Journal {
    pub version: u32,
    pub job_id: u64,
    pub cluster: String,
    pub node: String,
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub tenant: String,
    pub tier: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Tier rules that other jobs' placement decisions read under the node lock.
    pub share_gpu: bool,
    pub share_node: bool,
    pub started: DateTime<Utc>,
    pub steps: Vec<Step>,
    /// The slot of the node's intent log that holds this journal's intents on disk (see
    /// [`crate::intent_log`]); none when the journal file itself was made durable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent_slot: Option<u32>,
    /// The boot of the node the intents were recorded in (`/proc/sys/kernel/random/boot_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

impl Journal {
    /// Whether the job's intents were recorded before the node last restarted: what its
    /// volatile layers made is gone (see [`crate::Layer::survives_restart`]). False when
    /// either boot is unknown.
    pub fn from_earlier_boot(&self) -> bool {
        let Some(then) = &self.boot_id else {
            return false;
        };
        // A job that started an hour or more after this boot began is this boot's: no need to
        // read the boot id (most epilogs). A clock stepped by more than that meanwhile only
        // makes the answer "this boot", which undoes everything, as before boots were told apart.
        if intent_log::booted_at().is_some_and(|b| self.started > b + chrono::Duration::hours(1)) {
            return false;
        }
        intent_log::boot_id().is_some_and(|now| *then != hex::encode(now))
    }

    /// The made value of an earlier layer, for layers that build on it (devices on mig).
    pub fn made_by(&self, layer: &str) -> Option<&Value> {
        self.steps
            .iter()
            .find(|s| s.layer == layer && s.state == StepState::Made)
            .and_then(|s| s.made.as_ref())
    }
}

/// Running jobs as placement decisions see them: one job, or (as [`JournalDir::occupants`]
/// gives them) every job of one description: same tenant, tier, rules and GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Occupant {
    /// The job, or the lowest job id of the group (named in refusals).
    pub job_id: u64,
    pub tenant: String,
    pub tier: String,
    pub share_gpu: bool,
    pub share_node: bool,
    /// The physical GPU of the job's MIG slice, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
    /// How many running jobs this entry stands for.
    pub jobs: u32,
}

/// An intent log record this build cannot read as a journal: its job and why.
pub type Unreadable = (u64, String);

impl Occupant {
    /// What a journal says about its job's occupancy.
    pub fn of(journal: &Journal) -> Occupant {
        let gpu_uuid = journal
            .steps
            .iter()
            .find_map(|s| crate::contract::holds_gpu(&s.intent, s.made.as_ref()));
        Occupant {
            job_id: journal.job_id,
            tenant: journal.tenant.clone(),
            tier: journal.tier.clone(),
            share_gpu: journal.share_gpu,
            share_node: journal.share_node,
            gpu_uuid,
            jobs: 1,
        }
    }
}

/// The occupancy index: an append-only log of `+ job tenant tier share_gpu share_node gpu`
/// and `- job` lines (names are validated: no spaces), compacted when mostly tombstones.
/// Adding or removing a job is one append; reading it (once per prolog) is a split per line,
/// no JSON, and what placement gets is one entry per distinct description, not per job.
const OCCUPANCY: &str = "occupancy";

/// Files that held a journal and now wait, in this subfolder, to be overwritten by a later one
/// instead of being unlinked (as PostgreSQL recycles WAL segments): freeing a file's blocks
/// and allocating new ones is most of a journal write's cost on a filesystem mounted with
/// `discard` (an unlink took 0.15-0.35 ms there, growing with the number of journals).
const SPARES: &str = ".spare";
const MAX_SPARES: usize = 16;

/// Unlinks `file`; gone already is fine.
fn unlink(file: &Path) -> io::Result<()> {
    match fs::remove_file(file) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Appends are checked for compaction each time the index grows past a multiple of this many
/// bytes, so the epilog reads the whole index only once every hundred or so jobs.
const COMPACT_STEP: u64 = 4096;

impl Occupant {
    fn line(&self) -> String {
        format!(
            "+ {} {} {} {} {} {}\n",
            self.job_id,
            self.tenant,
            self.tier,
            u8::from(self.share_gpu),
            u8::from(self.share_node),
            self.gpu_uuid.as_deref().unwrap_or("-")
        )
    }
}

/// Folds the index into its live jobs, each with the rest of its line (`tenant tier share_gpu
/// share_node gpu`), in job order, and counts the lines; `None` when a line is damaged (then
/// it is rebuilt). The last line naming a job decides; sorting the (mostly ordered) lines by
/// job finds it without hashing every line.
fn fold_occupancy(text: &str) -> Option<(Vec<(u64, &str)>, usize)> {
    let mut ops: Vec<(u64, u32, Option<&str>)> = Vec::with_capacity(text.len() / 24 + 1);
    for (n, line) in text.lines().enumerate() {
        let op = match line.strip_prefix("+ ") {
            Some(rest) => {
                let (job, desc) = rest.split_once(' ')?;
                (job.parse().ok()?, n as u32, Some(desc))
            }
            None => (line.strip_prefix("- ")?.parse().ok()?, n as u32, None),
        };
        ops.push(op);
    }
    let lines = ops.len();
    ops.sort_unstable_by_key(|&(job, n, _)| (job, n));
    let live = ops
        .iter()
        .enumerate()
        .filter(|&(k, op)| ops.get(k + 1).is_none_or(|next| next.0 != op.0))
        .filter_map(|(_, &(job, _, desc))| Some((job, desc?)))
        .collect();
    Some((live, lines))
}

/// The live jobs other than `exclude`, one entry per distinct description (only those few are
/// parsed into strings); `None` when the index is damaged.
fn group_occupancy(text: &str, exclude: u64) -> Option<Vec<Occupant>> {
    let (live, _) = fold_occupancy(text)?;
    // (description, lowest job, jobs); a node holds few distinct descriptions.
    let mut groups: Vec<(&str, u64, u32)> = Vec::new();
    for (job, desc) in live {
        if job == exclude {
            continue;
        }
        match groups.iter_mut().find(|g| g.0 == desc) {
            // Jobs come in ascending order: the first one seen is the lowest.
            Some(g) => g.2 += 1,
            None => groups.push((desc, job, 1)),
        }
    }
    let flag = |v: &str| match v {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    };
    let mut out = Vec::with_capacity(groups.len());
    for (desc, job_id, jobs) in groups {
        let f: Vec<&str> = desc.split(' ').collect();
        let [tenant, tier, gpu_ok, node_ok, gpu] = f.as_slice() else {
            return None;
        };
        out.push(Occupant {
            job_id,
            tenant: tenant.to_string(),
            tier: tier.to_string(),
            share_gpu: flag(gpu_ok)?,
            share_node: flag(node_ok)?,
            gpu_uuid: (*gpu != "-").then(|| gpu.to_string()),
            jobs,
        });
    }
    out.sort_by_key(|o| o.job_id);
    Some(out)
}

/// The folder of journals on this node.
#[derive(Debug, Clone)]
pub struct JournalDir {
    dir: PathBuf,
}

impl JournalDir {
    /// Opens the state folder, creating it (root only, 0700) when missing.
    pub fn open(dir: &Path) -> io::Result<JournalDir> {
        // Nearly always there already: one stat, not a mkdir failing with EEXIST and then a stat.
        if fs::metadata(dir).is_ok_and(|m| m.is_dir()) {
            return Ok(JournalDir {
                dir: dir.to_path_buf(),
            });
        }
        match fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
        {
            Ok(()) => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot create state_dir {}: {e}", dir.display()),
                ))
            }
        }
        Ok(JournalDir {
            dir: dir.to_path_buf(),
        })
    }

    /// The folder at `dir`, without touching the filesystem (the spine opens and creates it).
    pub fn at(dir: &Path) -> JournalDir {
        JournalDir {
            dir: dir.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn journal_path(&self, job_id: u64) -> PathBuf {
        self.dir.join(format!("job_{job_id}.json"))
    }

    pub fn load(&self, job_id: u64) -> io::Result<Option<Journal>> {
        let path = self.journal_path(job_id);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let journal: Journal = serde_json::from_slice(&bytes).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("journal {} is unreadable: {e}", path.display()),
            )
        })?;
        // Files are replaced by recycled spares: after a power loss (or, for a reader without
        // the node lock, while a spare is being recycled) the name can hold another job's
        // journal. Acting on it would act on that job's resources.
        if journal.job_id != job_id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "journal {} holds job {}'s journal, not job {job_id}'s",
                    path.display(),
                    journal.job_id
                ),
            ));
        }
        Ok(Some(journal))
    }

    /// [`Self::load`] for readers that do not hold the node lock: a spare being recycled
    /// between its open and read can show a partial or another job's journal, so a parse
    /// error or an id mismatch is retried a few times before it is returned.
    pub fn load_unlocked(&self, job_id: u64) -> io::Result<Option<Journal>> {
        self.load_retrying(job_id, 3, || {
            std::thread::sleep(std::time::Duration::from_millis(20))
        })
    }

    /// [`Self::load`], tried again up to `retries` times on a torn or foreign file, with
    /// `pause` before each new try.
    fn load_retrying(
        &self,
        job_id: u64,
        retries: u32,
        mut pause: impl FnMut(),
    ) -> io::Result<Option<Journal>> {
        let mut tries = 0;
        loop {
            match self.load(job_id) {
                Err(e) if e.kind() == io::ErrorKind::InvalidData && tries < retries => {
                    tries += 1;
                    pause();
                }
                r => return r,
            }
        }
    }

    /// Records the job's intents before anything they announce is made: the journal file
    /// (not synced) and a slot of the node's intent log, written in place, whose write to the
    /// disk is under way when this returns: [`Flushing::wait`] returns once it is there, which
    /// the prolog needs before it makes what outlives a restart. A slot needs no block
    /// allocated and no size changed, where a journal file of its own on disk needs two syncs
    /// (data, inode, folder). Falls back to [`Self::save`] with `durable` when the log cannot
    /// be used (no boot id, a journal too large for a slot, a full log); the intents are then
    /// on disk on return. Call it under the node lock.
    pub fn save_intents(&self, journal: &mut Journal) -> io::Result<Flushing> {
        if let Some(boot) = intent_log::boot_id() {
            journal.boot_id = Some(hex::encode(boot));
            let mut log = IntentLog::open(&self.dir)?;
            let slot = log.claim(|r| {
                // A record of this boot whose job has no journal: its job ended, or its prolog
                // died before the journal file was written (that comes first, below).
                r.boot == boot && !self.journal_path(r.job_id).exists()
            })?;
            if let Some(slot) = slot {
                journal.intent_slot = Some(slot);
                let bytes = serde_json::to_vec(journal).map_err(io::Error::other)?;
                if bytes.len() <= intent_log::CAPACITY {
                    self.replace_file(&format!("job_{}.json", journal.job_id), &bytes, false)?;
                    return log.write_flushing(slot, journal.job_id, &boot, &bytes);
                }
            }
        }
        journal.intent_slot = None;
        self.save(journal, true)?;
        Ok(Flushing::done())
    }

    /// Replaces the job's journal atomically; `durable` also fsyncs the file and the folder
    /// (needed before anything the journal announces is made).
    pub fn save(&self, journal: &Journal, durable: bool) -> io::Result<()> {
        let bytes = serde_json::to_vec(journal).map_err(io::Error::other)?;
        self.replace_file(&format!("job_{}.json", journal.job_id), &bytes, durable)
    }

    /// Replaces `name` in the folder atomically (temporary file, rename; never through a
    /// symlink); `durable` also fsyncs the file and the folder.
    ///
    /// The temporary file is a spare when there is one (see [`SPARES`]), overwritten in place,
    /// and it is exchanged with the current file (RENAME_EXCHANGE), which then becomes a spare.
    /// A plain rename over a file would also make ext4 (auto_da_alloc) start writing the new
    /// data out at once, and the epilog's unlink would wait for that write.
    pub(crate) fn replace_file(&self, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let took_spare = self.take_spare(&tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)?;
        f.write_all(bytes)?;
        // A spare may be longer than what replaces its content.
        f.set_len(bytes.len() as u64)?;
        if durable {
            f.sync_data()?;
        }
        let path = self.dir.join(name);
        let cwd = rustix::fs::CWD;
        let exchanged =
            match rustix::fs::renameat_with(cwd, &tmp, cwd, &path, RenameFlags::EXCHANGE) {
                Ok(()) => true,
                // No file to exchange with yet, or a filesystem without RENAME_EXCHANGE.
                Err(Errno::NOENT | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                    fs::rename(&tmp, &path)?;
                    false
                }
                Err(e) => return Err(e.into()),
            };
        if durable {
            self.sync_dir()?;
        }
        if exchanged {
            // The old content now has the temporary name. Left there (if this fails) it is
            // harmless: the next write overwrites it, `remove` deletes it. It takes the place
            // of the spare taken above, if any, so the spares need no counting then.
            let _ = if took_spare {
                self.park_spare(&tmp)
            } else {
                self.keep_spare(&tmp)
            };
        }
        Ok(())
    }

    /// Moves a spare file to `dest`, there to be overwritten; false when there is none.
    fn take_spare(&self, dest: &Path) -> bool {
        let Ok(entries) = fs::read_dir(self.dir.join(SPARES)) else {
            return false;
        };
        // Another process may take the same spare first (rename is atomic): try a few.
        entries
            .flatten()
            .take(4)
            .any(|entry| fs::rename(entry.path(), dest).is_ok())
    }

    /// Keeps `file` as a spare, or unlinks it when there are enough; gone already is fine.
    fn keep_spare(&self, file: &Path) -> io::Result<()> {
        let spares = self.dir.join(SPARES);
        let count = match fs::read_dir(&spares) {
            Ok(entries) => entries.count(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match fs::DirBuilder::new().mode(0o700).create(&spares) {
                    Ok(()) => 0,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => 0,
                    Err(_) => MAX_SPARES,
                }
            }
            Err(_) => MAX_SPARES,
        };
        if count < MAX_SPARES {
            self.park_spare(file)
        } else {
            unlink(file)
        }
    }

    /// Moves `file` among the spares (the folder exists), or unlinks it when that fails; gone
    /// already is fine.
    fn park_spare(&self, file: &Path) -> io::Result<()> {
        // The inode number names the file uniquely while it exists.
        let kept = fs::symlink_metadata(file).is_ok_and(|m| {
            let name = self
                .dir
                .join(SPARES)
                .join(std::os::unix::fs::MetadataExt::ino(&m).to_string());
            let cwd = rustix::fs::CWD;
            rustix::fs::renameat_with(cwd, file, cwd, &name, RenameFlags::NOREPLACE).is_ok()
        });
        if kept {
            Ok(())
        } else {
            unlink(file)
        }
    }

    /// Removes the job's journal (already gone is fine: it becomes a spare), and a temporary
    /// file a crash inside [`Self::replace_file`] may have left. The folder is not fsynced:
    /// a journal that a power loss brings back only makes `reconcile` undo its job again, and
    /// every undo is idempotent (what it names is gone: cgroups, programs and MIG instances do
    /// not survive a reboot, and the scratch folder was removed first).
    ///
    /// The job's intent log slot is released first, so a crash in between leaves a journal
    /// (undone again by reconcile), never a slot no journal accounts for.
    pub fn remove(&self, journal: &Journal) -> io::Result<()> {
        let job_id = journal.job_id;
        if let Some(slot) = journal.intent_slot {
            IntentLog::release_in(&self.dir, slot, job_id)?;
        }
        let _ = fs::remove_file(self.dir.join(format!(".job_{job_id}.json.tmp")));
        self.keep_spare(&self.journal_path(job_id))
    }

    /// After a restart: the journals whose intents the intent log holds from an earlier boot
    /// and whose file is missing, unreadable or older (a power loss can take what was written
    /// since the last sync), in job order. With `apply`, each is written back (durably) and
    /// every slot of an earlier boot, or of a job without a journal, is released; without,
    /// nothing changes. Call it under the node lock.
    ///
    /// Records that cannot be read as a journal are named in the second list, with their job,
    /// and kept.
    pub fn recover_intents(&self, apply: bool) -> io::Result<(Vec<Journal>, Vec<Unreadable>)> {
        let Some(log) = IntentLog::open_existing(&self.dir)? else {
            return Ok((Vec::new(), Vec::new()));
        };
        let boot = intent_log::boot_id();
        let mut lost = Vec::new();
        let mut unreadable = Vec::new();
        for rec in log.records()? {
            let this_boot = boot == Some(rec.boot);
            if !this_boot {
                let from_log: Journal = match serde_json::from_slice(&rec.payload) {
                    Ok(j) => j,
                    Err(e) => {
                        unreadable.push((
                            rec.job_id,
                            format!(
                                "slot {} of {} (job {}) is not a journal this build reads: {e}",
                                rec.slot,
                                self.dir.join(intent_log::FILE).display(),
                                rec.job_id
                            ),
                        ));
                        continue;
                    }
                };
                // The file is the newer one when it is this attempt's and at least as far on,
                // or a later attempt's: the job requeued onto this node since the restart (its
                // journal names this boot), whose journal must not be replaced by the dead
                // attempt's intents.
                let this_boot_name = boot.map(hex::encode);
                let file_holds_it = matches!(
                    self.load(rec.job_id),
                    Ok(Some(j)) if (j.started == from_log.started
                        && j.steps.len() >= from_log.steps.len())
                        || j.started > from_log.started
                        || (j.boot_id.is_some() && j.boot_id == this_boot_name)
                );
                if !file_holds_it {
                    if apply {
                        self.save(&from_log, true)?;
                    }
                    lost.push(from_log);
                }
            }
            if apply && (!this_boot || !self.journal_path(rec.job_id).exists()) {
                log.release(rec.slot, rec.job_id)?;
            }
        }
        lost.sort_by_key(|j| j.job_id);
        Ok((lost, unreadable))
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    /// Ids of every job with a journal on this node.
    pub fn job_ids(&self) -> io::Result<Vec<u64>> {
        let mut ids = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            // (the occupancy index and dot files are not journals: the name filter skips them)
            let name = entry?.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(id) = name
                .strip_prefix("job_")
                .and_then(|r| r.strip_suffix(".json"))
                .and_then(|n| n.parse().ok())
            {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// Every other job's journal, for tier decisions made under the node lock.
    pub fn others(&self, job_id: u64) -> io::Result<Vec<Journal>> {
        let mut out = Vec::new();
        for id in self.job_ids()? {
            if id != job_id {
                if let Some(j) = self.load(id)? {
                    out.push(j);
                }
            }
        }
        Ok(out)
    }

    /// The jobs on this node, other than `job_id`, from the occupancy index, grouped by
    /// description: one file read instead of one per journal, and as many entries as there are
    /// distinct tenants and GPUs, not jobs. The index is rebuilt from the journals when it is
    /// missing or unreadable. Call under the node lock.
    pub fn occupants(&self, job_id: u64) -> io::Result<Vec<Occupant>> {
        match fs::read_to_string(self.dir.join(OCCUPANCY)) {
            Ok(text) => {
                if let Some(v) = group_occupancy(&text, job_id) {
                    return Ok(v);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {}
            Err(e) => return Err(e),
        }
        let rebuilt = self.rebuild_occupancy()?;
        group_occupancy(&rebuilt, job_id)
            .ok_or_else(|| io::Error::other("the rebuilt occupancy index does not parse"))
    }

    /// Rewrites the index from the journals (`tenancyctl reconcile --apply`, which holds the
    /// node lock: an entry left by an epilog killed mid-teardown is otherwise never removed).
    /// Returns the jobs the old index listed, or `None` when it was missing or damaged, and
    /// the jobs the new one lists, when they differ (a missing index that rebuilds empty does
    /// not).
    #[allow(clippy::type_complexity)]
    pub fn rebuild_occupancy_index(&self) -> io::Result<Option<(Option<Vec<u64>>, Vec<u64>)>> {
        let old = match fs::read_to_string(self.dir.join(OCCUPANCY)) {
            Ok(text) => fold_occupancy(&text).map(|(live, _)| {
                live.iter()
                    .map(|&(job, desc)| (job, desc.to_string()))
                    .collect::<Vec<_>>()
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => None,
            Err(e) => return Err(e),
        };
        let text = self.rebuild_occupancy()?;
        let new: Vec<(u64, String)> = fold_occupancy(&text)
            .ok_or_else(|| io::Error::other("the rebuilt occupancy index does not parse"))?
            .0
            .iter()
            .map(|&(job, desc)| (job, desc.to_string()))
            .collect();
        // (a missing index that rebuilds empty lost nothing)
        if old.as_ref().map_or(new.is_empty(), |o| *o == new) {
            return Ok(None);
        }
        let ids = |v: &[(u64, String)]| v.iter().map(|e| e.0).collect::<Vec<_>>();
        Ok(Some((old.as_deref().map(ids), ids(&new))))
    }

    /// Writes the index afresh from the journals; returns its text.
    fn rebuild_occupancy(&self) -> io::Result<String> {
        let text: String = self
            .others(0)?
            .iter()
            .map(|j| Occupant::of(j).line())
            .collect();
        self.write_occupancy(&text)?;
        Ok(text)
    }

    /// Sets (`Some`) or removes (`None`) the job's entry: one append, without reading the
    /// index (removing a job it does not list is harmless). Call under the node lock.
    pub fn set_occupant(&self, job_id: u64, entry: Option<Occupant>) -> io::Result<()> {
        let line = match &entry {
            Some(e) => e.line(),
            None => format!("- {job_id}\n"),
        };
        let mut f = match OpenOptions::new()
            .append(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(self.dir.join(OCCUPANCY))
        {
            Ok(f) => f,
            // A missing index is rebuilt from the journals (a starting job's included); a
            // removal has nothing to remove from.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return match entry {
                    Some(_) => self.rebuild_occupancy().map(|_| ()),
                    None => Ok(()),
                }
            }
            Err(e) => return Err(e),
        };
        // One write in O_APPEND: a line is whole or absent.
        f.write_all(line.as_bytes())?;
        let len = f.metadata()?.len();
        if len / COMPACT_STEP != len.saturating_sub(line.len() as u64) / COMPACT_STEP {
            self.compact_occupancy()?;
        }
        Ok(())
    }

    /// Rewrites the index with only its live jobs once tombstones dominate it.
    fn compact_occupancy(&self) -> io::Result<()> {
        let text = fs::read_to_string(self.dir.join(OCCUPANCY))?;
        let Some((live, lines)) = fold_occupancy(&text) else {
            return self.rebuild_occupancy().map(|_| ());
        };
        if lines <= 2 * live.len() + 64 {
            return Ok(());
        }
        let compact: String = live
            .into_iter()
            .map(|(job, desc)| format!("+ {job} {desc}\n"))
            .collect();
        self.write_occupancy(&compact)
    }

    fn write_occupancy(&self, text: &str) -> io::Result<()> {
        // No fsync: the index is derived from the journals (which are durable); after a crash
        // a stale or lost entry is rebuilt by `tenancyctl reconcile`, and a stale one only
        // refuses sharing (fail closed).
        self.replace_file(OCCUPANCY, text.as_bytes(), false)
    }

    /// Takes the node-wide lock (released on drop) that serialises placement decisions.
    pub fn lock_node(&self) -> io::Result<NodeLock> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.dir.join(".node.lock"))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)?;
        Ok(NodeLock { _file: f })
    }
}

/// Held while a job's placement is decided and made; the lock goes with the file.
pub struct NodeLock {
    _file: File,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(job_id: u64) -> Journal {
        Journal {
            version: VERSION,
            job_id,
            cluster: "c".into(),
            node: "n".into(),
            user: "u".into(),
            uid: 1,
            gid: 1,
            tenant: "acme".into(),
            tier: "internal".into(),
            profile: None,
            share_gpu: true,
            share_node: true,
            started: Utc::now(),
            steps: vec![Step {
                layer: "scratch".into(),
                state: StepState::Intended,
                intent: serde_json::json!({"path": "/x"}),
                made: None,
            }],
            intent_slot: None,
            boot_id: None,
        }
    }

    #[test]
    fn save_load_remove_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(&tmp.path().join("state")).unwrap();
        assert_eq!(dir.load(7).unwrap(), None);
        let j = sample(7);
        dir.save(&j, true).unwrap();
        dir.save(&sample(8), true).unwrap();
        assert_eq!(dir.load(7).unwrap(), Some(j));
        assert_eq!(dir.job_ids().unwrap(), vec![7, 8]);
        assert_eq!(dir.others(7).unwrap().len(), 1);
        dir.remove(&sample(7)).unwrap();
        dir.remove(&sample(7)).unwrap();
        assert_eq!(dir.job_ids().unwrap(), vec![8]);
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(names.iter().all(|n| !n.to_string_lossy().ends_with(".tmp")));
    }

    #[test]
    fn occupancy_index_follows_jobs_and_is_rebuilt_when_lost() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let mut a = sample(1);
        a.steps = vec![Step {
            layer: "mig".into(),
            state: StepState::Made,
            intent: serde_json::json!({"gpu_uuid": "GPU-a"}),
            made: Some(serde_json::json!({"gpu_uuid": "GPU-a", "gi_id": 7})),
        }];
        dir.save(&a, true).unwrap();
        // No index yet: rebuilt from the journals.
        let occ = dir.occupants(99).unwrap();
        assert_eq!(occ, vec![Occupant::of(&a)]);
        assert_eq!(occ[0].gpu_uuid.as_deref(), Some("GPU-a"));
        let b = sample(2);
        dir.save(&b, true).unwrap();
        dir.set_occupant(2, Some(Occupant::of(&b))).unwrap();
        let ids: Vec<u64> = dir
            .occupants(99)
            .unwrap()
            .iter()
            .map(|o| o.job_id)
            .collect();
        assert_eq!(ids, vec![1, 2]);
        assert_eq!(
            dir.occupants(1).unwrap().len(),
            1,
            "a job does not see itself"
        );
        dir.set_occupant(1, None).unwrap();
        assert_eq!(dir.occupants(99).unwrap(), vec![Occupant::of(&b)]);
        // A damaged index is rebuilt from the journals (both still exist).
        fs::write(dir.path().join(OCCUPANCY), b"+ 1 acme\n").unwrap();
        assert_eq!(dir.occupants(99).unwrap().len(), 2);
        // Appends are compacted once tombstones dominate: the file stays O(live jobs).
        for _ in 0..2000 {
            dir.set_occupant(3, Some(Occupant::of(&sample(3)))).unwrap();
            dir.set_occupant(3, None).unwrap();
        }
        let len = fs::metadata(dir.path().join(OCCUPANCY)).unwrap().len();
        assert!(len < 2 * COMPACT_STEP, "{len} bytes for 2 live jobs");
        assert_eq!(dir.occupants(99).unwrap().len(), 2);
        // The index is not mistaken for a journal.
        assert_eq!(dir.job_ids().unwrap(), vec![1, 2]);
    }

    #[test]
    fn occupants_are_grouped_by_description_so_placement_reads_few_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        fs::write(dir.path().join(OCCUPANCY), b"").unwrap();
        for job in 10..1010 {
            dir.set_occupant(job, Some(Occupant::of(&sample(job))))
                .unwrap();
        }
        let mut other = sample(5000);
        other.tenant = "globex".into();
        other.share_node = false;
        dir.set_occupant(5000, Some(Occupant::of(&other))).unwrap();
        dir.set_occupant(10, None).unwrap();
        let occ = dir.occupants(11).unwrap();
        assert_eq!(occ.len(), 2, "{occ:?}");
        assert_eq!((occ[0].job_id, occ[0].jobs), (12, 998));
        assert_eq!(occ[0].tenant, "acme");
        assert_eq!((occ[1].job_id, occ[1].jobs), (5000, 1));
        assert!(!occ[1].share_node);
        // An empty index is a node without jobs, not a damaged one: nothing is rebuilt.
        let empty = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(empty.path()).unwrap();
        dir.save(&sample(1), true).unwrap();
        fs::write(dir.path().join(OCCUPANCY), b"").unwrap();
        assert_eq!(dir.occupants(99).unwrap(), vec![]);
    }

    #[test]
    fn ended_journals_are_recycled_as_spares_and_overwritten_whole() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let spares = || -> Vec<u64> {
            let mut v: Vec<u64> = fs::read_dir(tmp.path().join(SPARES))
                .map(|rd| rd.map(|e| e.unwrap().metadata().unwrap().ino()).collect())
                .unwrap_or_default();
            v.sort_unstable();
            v
        };
        // A long journal ends: its file waits as a spare.
        let mut long = sample(1);
        long.user = "u".repeat(5000);
        dir.save(&long, true).unwrap();
        dir.remove(&long).unwrap();
        assert_eq!(dir.load(1).unwrap(), None);
        let kept = spares();
        assert_eq!(kept.len(), 1);
        // The next journal is written into it, cut to its own length.
        let short = sample(2);
        dir.save(&short, true).unwrap();
        assert_eq!(fs::metadata(dir.journal_path(2)).unwrap().ino(), kept[0]);
        assert_eq!(dir.load(2).unwrap(), Some(short.clone()));
        // Replacing it keeps the replaced file as a spare; the result reads back whole.
        let mut done = short.clone();
        done.steps[0].state = StepState::Made;
        dir.save(&done, false).unwrap();
        assert_eq!(dir.load(2).unwrap(), Some(done));
        assert_eq!(spares(), kept);
        // The pool is bounded; the rest is unlinked.
        for job in 10..40 {
            dir.save(&sample(job), true).unwrap();
        }
        for job in 10..40 {
            dir.remove(&sample(job)).unwrap();
        }
        assert_eq!(spares().len(), MAX_SPARES);
        assert_eq!(dir.job_ids().unwrap(), vec![2]);
    }

    #[test]
    fn intents_go_to_the_intent_log_and_leave_it_with_the_journal() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let mut j = sample(70);
        dir.save_intents(&mut j).unwrap().wait().unwrap();
        let slot = j.intent_slot.expect("a slot");
        assert_eq!(dir.load(70).unwrap(), Some(j.clone()));
        let log = IntentLog::open_existing(tmp.path()).unwrap().unwrap();
        let recs = log.records().unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!((recs[0].slot, recs[0].job_id), (slot, 70));
        assert_eq!(recs[0].boot, intent_log::boot_id().unwrap());
        let logged: Journal = serde_json::from_slice(&recs[0].payload).unwrap();
        assert_eq!(logged, j);
        // A later, larger result does not touch the log.
        let mut done = j.clone();
        done.steps[0].state = StepState::Made;
        done.steps[0].made = Some(serde_json::json!({"path": "/x", "uid": 1}));
        dir.save(&done, false).unwrap();
        assert_eq!(log.records().unwrap(), recs);
        // The job ends: the slot is free, the journal gone.
        dir.remove(&done).unwrap();
        assert!(log.records().unwrap().is_empty());
        assert_eq!(dir.load(70).unwrap(), None);
    }

    #[test]
    fn a_journal_too_large_for_a_slot_is_made_durable_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let mut j = sample(5);
        j.user = "u".repeat(intent_log::CAPACITY);
        dir.save_intents(&mut j).unwrap().wait().unwrap();
        assert_eq!(j.intent_slot, None);
        assert_eq!(dir.load(5).unwrap(), Some(j));
        let log = IntentLog::open_existing(tmp.path()).unwrap().unwrap();
        assert!(log.records().unwrap().is_empty());
    }

    #[test]
    fn a_slot_whose_job_left_no_journal_is_taken_again_before_the_log_grows() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let size = || {
            fs::metadata(tmp.path().join(intent_log::FILE))
                .unwrap()
                .len()
        };
        let mut slots = Vec::new();
        for job in 0..64 {
            let mut j = sample(job);
            dir.save_intents(&mut j).unwrap().wait().unwrap();
            slots.push(j.intent_slot.unwrap());
        }
        let full = size();
        // Job 3's journal went without its slot (a crash between the two).
        fs::remove_file(dir.journal_path(3)).unwrap();
        let mut next = sample(200);
        dir.save_intents(&mut next).unwrap().wait().unwrap();
        assert_eq!(next.intent_slot, Some(slots[3]));
        assert_eq!(size(), full);
        // Live jobs' slots are not: the log grows.
        let mut more = sample(201);
        dir.save_intents(&mut more).unwrap().wait().unwrap();
        assert!(!slots.contains(&more.intent_slot.unwrap()));
        assert_eq!(size(), 2 * full);
    }

    #[test]
    fn after_a_restart_journals_are_restored_from_the_intent_log() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let earlier = [0xee; 16];
        let mut log = IntentLog::open(tmp.path()).unwrap();
        let mut put = |j: &mut Journal| {
            let slot = log.claim(|_| false).unwrap().unwrap();
            j.intent_slot = Some(slot);
            log.write(slot, j.job_id, &earlier, &serde_json::to_vec(&*j).unwrap())
                .unwrap();
        };
        // 1: the journal file is gone; 2: it is empty (written, never synced); 3: it holds the
        // same attempt, further on; 4: an older attempt of the same job.
        let mut lost = sample(1);
        put(&mut lost);
        let mut empty = sample(2);
        put(&mut empty);
        fs::write(dir.journal_path(2), b"").unwrap();
        let mut kept = sample(3);
        put(&mut kept);
        let mut further = kept.clone();
        further.steps[0].state = StepState::Made;
        dir.save(&further, false).unwrap();
        let mut newer = sample(4);
        let mut older = newer.clone();
        older.started -= chrono::Duration::seconds(60);
        dir.save(&older, false).unwrap();
        put(&mut newer);
        // This boot's record of a live job stays.
        let mut live = sample(5);
        dir.save_intents(&mut live).unwrap().wait().unwrap();
        // 6: the job was requeued onto this node since the restart: its journal (this boot's)
        // stays, the dead attempt's record only goes.
        let mut dead = sample(6);
        put(&mut dead);
        let mut requeued = sample(6);
        requeued.started = dead.started + chrono::Duration::seconds(90);
        requeued.boot_id = intent_log::boot_id().map(hex::encode);
        dir.save(&requeued, false).unwrap();

        // A dry run says what it would restore and changes nothing.
        let (found, bad) = dir.recover_intents(false).unwrap();
        assert!(bad.is_empty());
        assert_eq!(found, vec![lost.clone(), empty.clone(), newer.clone()]);
        assert_eq!(dir.load(1).unwrap(), None);
        let log = IntentLog::open_existing(tmp.path()).unwrap().unwrap();
        assert_eq!(log.records().unwrap().len(), 6);

        let (found, _) = dir.recover_intents(true).unwrap();
        assert_eq!(found, vec![lost.clone(), empty.clone(), newer.clone()]);
        assert_eq!(dir.load(1).unwrap(), Some(lost));
        assert_eq!(dir.load(2).unwrap(), Some(empty));
        assert_eq!(dir.load(3).unwrap(), Some(further));
        assert_eq!(dir.load(4).unwrap(), Some(newer));
        assert_eq!(dir.load(6).unwrap(), Some(requeued));
        // Only the live job's slot is still held; a second pass finds nothing.
        let recs = log.records().unwrap();
        assert_eq!(recs.iter().map(|r| r.job_id).collect::<Vec<_>>(), [5]);
        assert_eq!(dir.recover_intents(true).unwrap(), (vec![], vec![]));
    }

    #[test]
    fn a_journal_is_from_an_earlier_boot_when_it_names_another_boot_and_started_before_this_one() {
        let booted = intent_log::booted_at().unwrap();
        let now = hex::encode(intent_log::boot_id().unwrap());
        let mut j = sample(1);
        assert!(!j.from_earlier_boot(), "no boot named");
        j.started = booted - chrono::Duration::minutes(1);
        j.boot_id = Some(now);
        assert!(!j.from_earlier_boot(), "this boot");
        j.boot_id = Some("ee".repeat(16));
        assert!(j.from_earlier_boot());
        // Started well after this boot began: this boot's, whatever it names.
        j.started = booted + chrono::Duration::hours(2);
        assert!(!j.from_earlier_boot());
    }

    #[test]
    fn corrupt_journal_is_an_error_not_a_missing_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        fs::write(dir.journal_path(9), b"{not json").unwrap();
        assert!(dir.load(9).is_err());
    }

    #[test]
    fn load_refuses_another_jobs_journal_under_a_jobs_name() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        // A recycled spare, after a power loss, can hold an older journal of another job.
        fs::write(dir.journal_path(5), serde_json::to_vec(&sample(9)).unwrap()).unwrap();
        let e = dir.load(5).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let msg = e.to_string();
        assert!(
            msg.contains("job_5.json") && msg.contains("job 9") && msg.contains("job 5"),
            "{msg}"
        );
        // Every job's own journal under every job's name: placement reads refuse a mixed one.
        dir.save(&sample(6), false).unwrap();
        assert!(dir.others(6).is_err());
        assert!(dir.load_unlocked(5).is_err(), "retries end");
    }

    #[test]
    fn recovery_restores_the_intents_over_another_jobs_journal_under_the_jobs_name() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let mut log = IntentLog::open(tmp.path()).unwrap();
        let mut n = sample(5);
        let slot = log.claim(|_| false).unwrap().unwrap();
        n.intent_slot = Some(slot);
        log.write(slot, 5, &[0xee; 16], &serde_json::to_vec(&n).unwrap())
            .unwrap();
        // job_5.json holds job 9's journal, started later: without the id check it passed as
        // job 5's newer journal and job 5's intents were dropped.
        let mut m = sample(9);
        m.started = n.started + chrono::Duration::seconds(2);
        fs::write(dir.journal_path(5), serde_json::to_vec(&m).unwrap()).unwrap();
        let (found, _) = dir.recover_intents(true).unwrap();
        assert_eq!(found, vec![n.clone()]);
        assert_eq!(dir.load(5).unwrap(), Some(n));
    }

    #[test]
    fn an_unlocked_reader_retries_past_a_spare_being_recycled() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        fs::write(dir.journal_path(7), serde_json::to_vec(&sample(8)).unwrap()).unwrap();
        let own = tmp.path().join("own");
        fs::write(&own, serde_json::to_vec(&sample(7)).unwrap()).unwrap();
        let path = dir.journal_path(7);
        // The prolog that recycled the spare finishes its write while the reader pauses.
        let mut pauses = 0;
        let got = dir.load_retrying(7, 3, || {
            pauses += 1;
            if pauses == 1 {
                fs::rename(&own, &path).unwrap();
            }
        });
        assert_eq!(got.unwrap().unwrap().job_id, 7);
        assert_eq!(pauses, 1);
        // A file that stays foreign is an error after the retries, never another job's journal.
        fs::write(dir.journal_path(9), serde_json::to_vec(&sample(8)).unwrap()).unwrap();
        let e = dir.load_retrying(9, 3, || ()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn teardown_removes_the_occupancy_entry_before_the_journal() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let mut j = sample(1);
        j.steps.clear();
        j.share_node = false;
        dir.save(&j, true).unwrap();
        dir.set_occupant(1, Some(Occupant::of(&j))).unwrap();
        // The `- 1` append fails (as if the epilog were killed there): the journal, which the
        // next epilog or reconcile tears down again, must still be there; an index entry
        // without a journal is never removed.
        let index = tmp.path().join(OCCUPANCY);
        fs::rename(&index, tmp.path().join("kept")).unwrap();
        std::os::unix::fs::symlink("kept", &index).unwrap();
        let failures = crate::spine::teardown(&mut [], &dir, &mut j);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(dir.load(1).unwrap(), Some(j.clone()));
        // With the index writable again it goes as the epilog would.
        fs::remove_file(&index).unwrap();
        fs::rename(tmp.path().join("kept"), &index).unwrap();
        assert!(crate::spine::teardown(&mut [], &dir, &mut j).is_empty());
        assert_eq!(dir.load(1).unwrap(), None);
        assert_eq!(dir.occupants(0).unwrap(), vec![]);
    }
}
