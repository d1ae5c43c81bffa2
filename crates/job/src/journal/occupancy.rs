//! The occupancy index: which jobs hold the node, as placement decisions read it under the
//! node lock.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;

use serde::{Deserialize, Serialize};

use super::{Journal, JournalDir};

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
pub(super) const OCCUPANCY: &str = "occupancy";

/// Appends are checked for compaction each time the index grows past a multiple of this many
/// bytes, so the epilog reads the whole index only once every hundred or so jobs.
pub(super) const COMPACT_STEP: u64 = 4096;

impl Occupant {
    pub(super) fn line(&self) -> String {
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
pub(super) fn fold_occupancy(text: &str) -> Option<(Vec<(u64, &str)>, usize)> {
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
pub(super) fn group_occupancy(text: &str, exclude: u64) -> Option<Vec<Occupant>> {
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

impl JournalDir {
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
}
