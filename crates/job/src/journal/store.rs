//! The folder of journals on this node: atomic writes, spare files, intent log, node lock.

use rustix::fs::RenameFlags;
use rustix::io::Errno;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::Journal;
use crate::intent_log::{self, Flushing, IntentLog};

/// An intent log record this build cannot read as a journal: its job and why.
pub type Unreadable = (u64, String);

/// Files that held a journal and now wait, in this subfolder, to be overwritten by a later one
/// instead of being unlinked (as PostgreSQL recycles WAL segments): freeing a file's blocks
/// and allocating new ones is most of a journal write's cost on a filesystem mounted with
/// `discard` (an unlink took 0.15-0.35 ms there, growing with the number of journals).
pub(super) const SPARES: &str = ".spare";
pub(super) const MAX_SPARES: usize = 16;

/// Unlinks `file`; gone already is fine.
pub(super) fn unlink(file: &Path) -> io::Result<()> {
    match fs::remove_file(file) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The folder of journals on this node.
#[derive(Debug, Clone)]
pub struct JournalDir {
    pub(super) dir: PathBuf,
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
    pub(super) fn load_retrying(
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
    pub fn replace_file(&self, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
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
