//! The per-job journal: what each layer intends to make, recorded before it is made, and what it
//! made, recorded after. Teardown (epilog, reconcile) works from the journal alone, so every
//! intent holds everything needed to find and undo its resource even if the config changed.
//!
//! Writes are atomic: a temporary file, fsync, rename over the journal, fsync of the folder.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

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
}

impl Journal {
    /// The made value of an earlier layer, for layers that build on it (devices on mig).
    pub fn made_by(&self, layer: &str) -> Option<&Value> {
        self.steps
            .iter()
            .find(|s| s.layer == layer && s.state == StepState::Made)
            .and_then(|s| s.made.as_ref())
    }
}

/// One running job as placement decisions see it: an entry of the node's occupancy index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Occupant {
    pub job_id: u64,
    pub tenant: String,
    pub tier: String,
    pub share_gpu: bool,
    pub share_node: bool,
    /// The physical GPU of the job's MIG slice, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
}

impl Occupant {
    /// What a journal says about its job's occupancy.
    pub fn of(journal: &Journal) -> Occupant {
        let gpu_uuid = journal
            .steps
            .iter()
            .find(|s| s.layer == "mig")
            .and_then(|s| s.made.as_ref().or(Some(&s.intent)))
            .and_then(|v| v.get("gpu_uuid"))
            .and_then(Value::as_str)
            .map(String::from);
        Occupant {
            job_id: journal.job_id,
            tenant: journal.tenant.clone(),
            tier: journal.tier.clone(),
            share_gpu: journal.share_gpu,
            share_node: journal.share_node,
            gpu_uuid,
        }
    }
}

/// The occupancy index: an append-only log of `+ job tenant tier share_gpu share_node gpu`
/// and `- job` lines (names are validated: no spaces), compacted when mostly tombstones.
/// Adding or removing a job is one append; reading it is a split per line, no JSON.
const OCCUPANCY: &str = "occupancy";

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

/// Folds the index into its live entries; `None` when a line is damaged (then it is rebuilt).
fn parse_occupancy(text: &str) -> Option<(Vec<Occupant>, usize)> {
    let mut live: std::collections::BTreeMap<u64, Occupant> = std::collections::BTreeMap::new();
    let mut lines = 0;
    for line in text.lines() {
        lines += 1;
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["+", job, tenant, tier, gpu_ok, node_ok, gpu] => {
                let job_id: u64 = job.parse().ok()?;
                let flag = |v: &str| match v {
                    "0" => Some(false),
                    "1" => Some(true),
                    _ => None,
                };
                live.insert(
                    job_id,
                    Occupant {
                        job_id,
                        tenant: tenant.to_string(),
                        tier: tier.to_string(),
                        share_gpu: flag(gpu_ok)?,
                        share_node: flag(node_ok)?,
                        gpu_uuid: (*gpu != "-").then(|| gpu.to_string()),
                    },
                );
            }
            ["-", job] => {
                live.remove(&job.parse().ok()?);
            }
            _ => return None,
        }
    }
    Some((live.into_values().collect(), lines))
}

/// The folder of journals on this node.
#[derive(Debug, Clone)]
pub struct JournalDir {
    dir: PathBuf,
}

impl JournalDir {
    /// Opens the state folder, creating it (root only, 0700) when missing.
    pub fn open(dir: &Path) -> io::Result<JournalDir> {
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
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("journal {} is unreadable: {e}", path.display()),
            )
        })
    }

    /// Replaces the job's journal atomically; `durable` also fsyncs the file and the folder
    /// (needed before anything the journal announces is made).
    pub fn save(&self, journal: &Journal, durable: bool) -> io::Result<()> {
        let bytes = serde_json::to_vec(journal).map_err(io::Error::other)?;
        self.replace_file(&format!("job_{}.json", journal.job_id), &bytes, durable)
    }

    /// Replaces `name` in the folder atomically (temporary file, rename; never through a
    /// symlink); `durable` also fsyncs the file and the folder.
    pub(crate) fn replace_file(&self, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if durable {
            f.sync_data()?;
        }
        fs::rename(&tmp, self.dir.join(name))?;
        if durable {
            self.sync_dir()?;
        }
        Ok(())
    }

    /// Removes the job's journal (already gone is fine).
    pub fn remove(&self, job_id: u64) -> io::Result<()> {
        match fs::remove_file(self.journal_path(job_id)) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
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

    /// The jobs on this node, other than `job_id`, from the occupancy index: one file read
    /// instead of one per journal, so a job's start costs the same on a full node. The index
    /// is rebuilt from the journals when it is missing or unreadable. Call under the node lock.
    pub fn occupants(&self, job_id: u64) -> io::Result<Vec<Occupant>> {
        Ok(self
            .occupancy()?
            .0
            .into_iter()
            .filter(|o| o.job_id != job_id)
            .collect())
    }

    /// Live entries and the number of lines they were folded from.
    fn occupancy(&self) -> io::Result<(Vec<Occupant>, usize)> {
        match fs::read_to_string(self.dir.join(OCCUPANCY)) {
            Ok(text) => match parse_occupancy(&text) {
                Some(v) => Ok(v),
                None => self.rebuild_occupancy(),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.rebuild_occupancy(),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => self.rebuild_occupancy(),
            Err(e) => Err(e),
        }
    }

    fn rebuild_occupancy(&self) -> io::Result<(Vec<Occupant>, usize)> {
        let all: Vec<Occupant> = self.others(0)?.iter().map(Occupant::of).collect();
        self.write_occupancy(&all)?;
        let n = all.len();
        Ok((all, n))
    }

    /// Sets (`Some`) or removes (`None`) the job's entry: one append. Call under the node lock.
    pub fn set_occupant(&self, job_id: u64, entry: Option<Occupant>) -> io::Result<()> {
        if let Some(e) = &entry {
            // A start is a bare append (the index is compacted on removals); a missing index is
            // rebuilt from the journals, this job's included.
            return match OpenOptions::new()
                .append(true)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                .open(self.dir.join(OCCUPANCY))
            {
                Ok(mut f) => f.write_all(e.line().as_bytes()),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    self.rebuild_occupancy().map(|_| ())
                }
                Err(err) => Err(err),
            };
        }
        let (live, lines) = self.occupancy()?;
        if !live.iter().any(|o| o.job_id == job_id) {
            return Ok(());
        }
        if lines > 2 * live.len() + 64 {
            let all: Vec<Occupant> = live.into_iter().filter(|o| o.job_id != job_id).collect();
            return self.write_occupancy(&all);
        }
        let line = format!("- {job_id}\n");
        let mut f = OpenOptions::new()
            .append(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(self.dir.join(OCCUPANCY))?;
        // One write in O_APPEND: a line is whole or absent.
        f.write_all(line.as_bytes())
    }

    fn write_occupancy(&self, all: &[Occupant]) -> io::Result<()> {
        // No fsync: the index is derived from the journals (which are durable); after a crash
        // a stale or lost entry is rebuilt by `tenancyctl reconcile`, and a stale one only
        // refuses sharing (fail closed).
        let text: String = all.iter().map(Occupant::line).collect();
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
        dir.remove(7).unwrap();
        dir.remove(7).unwrap();
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
        for _ in 0..200 {
            dir.set_occupant(3, Some(Occupant::of(&sample(3)))).unwrap();
            dir.set_occupant(3, None).unwrap();
        }
        let lines = fs::read_to_string(dir.path().join(OCCUPANCY))
            .unwrap()
            .lines()
            .count();
        assert!(lines <= 2 * 2 + 64 + 2, "{lines} lines for 2 live jobs");
        assert_eq!(dir.occupants(99).unwrap().len(), 2);
        // The index is not mistaken for a journal.
        assert_eq!(dir.job_ids().unwrap(), vec![1, 2]);
    }

    #[test]
    fn corrupt_journal_is_an_error_not_a_missing_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        fs::write(dir.journal_path(9), b"{not json").unwrap();
        assert!(dir.load(9).is_err());
    }
}
