//! What the soak checks at the end, on every node, by reading the nodes' state (not logs by
//! eye): nothing left of any job (cgroup, nft element, scratch tree, journal, process; and
//! `tenancyctl reconcile` finds nothing to do; no MIG instance in the NVML stand-in's state),
//! every job Slurm ran has its records on each of its nodes (a record is excused only behind a
//! fault that explains it: a killed prolog, a full audit disk while the job's prolog or epilog
//! ran there), Slurm's accounting agrees (`report --compare-sacct`), every record chain
//! verifies, every record reached the collector, every drain has its cause, and a cross-node
//! isolation attack still fails.

use super::faults::{slurm_epoch, Drain, Fault, FaultKind, DRAIN_WINDOW_S};
use super::workload::{JobKind, Workload};
use crate::{artifact, parse_kv, probe_kv, MultiNode};
use anyhow::{Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::time::Duration;

/// Counts of what was checked, and what failed (each a sentence).
#[derive(Debug, Default)]
pub struct Checks {
    pub counts: BTreeMap<String, usize>,
    pub failures: Vec<String>,
    /// The prologs' and epilogs' `duration_us` on their records.
    pub prolog_us: Vec<u64>,
    pub epilog_us: Vec<u64>,
    /// Of those, the records that name a MIG profile (the job had a slice), and the others.
    pub prolog_mig_us: Vec<u64>,
    pub epilog_mig_us: Vec<u64>,
    pub prolog_cpu_us: Vec<u64>,
    pub epilog_cpu_us: Vec<u64>,
    /// Each started job's first `job_start` on any node (seconds since the epoch).
    pub first_starts: Vec<f64>,
    /// What the failures of a job's checks were looked into with: per failed job, Slurm's
    /// view, its records and its daemons' log lines (so that a red CI run explains itself).
    pub details: Vec<String>,
    /// Jobs whose records a fault (or Slurm 22.05's skipped prolog) explains the want of.
    pub excused: BTreeSet<u64>,
    /// Each job's state as slurmctld ends with it.
    pub states: BTreeMap<u64, String>,
}

impl Checks {
    fn count(&mut self, what: &str, n: usize) {
        *self.counts.entry(what.to_string()).or_default() += n;
    }

    /// Counts `what` for job `id`, whose records it explains the want of.
    fn excuse(&mut self, id: u64, what: &str) {
        self.count(what, 1);
        self.excused.insert(id);
    }

    fn fail(&mut self, what: String) {
        self.failures.push(what);
    }
}

/// The `p`th percentile of `v` (nearest rank; 0 for none).
pub fn percentile(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// One node's records of one job.
#[derive(Debug, Default, Clone)]
pub struct JobRecords {
    pub starts: usize,
    pub ends: usize,
    /// Runs whose `job_start` no `job_end` followed before the job's next `job_start` or the
    /// log's end. A `job_end` closes the run it follows only: the epilog of a run with no
    /// journal (its prolog refused, rolled back, killed or never run) writes one too ("no
    /// journal"), as does an epilog Slurm runs again after a slurmd restart. Counted against a
    /// later run, such a `job_end` hid that run's missing one: job 2892 of the soak at size had
    /// as many `job_end` as `job_start` records on n1 and no end after its last start, so no
    /// check here judged what `--compare-sacct` then failed on.
    pub unended: usize,
    /// A `job_start` no `job_end` has followed yet (while reading the log).
    open: bool,
    pub denied: usize,
    pub rollbacks: usize,
    pub reconciled: usize,
    /// When `tenancyctl reconcile` removed something of the job (seconds since the epoch).
    pub reconciled_at: Vec<f64>,
    /// Its first `job_start` (seconds since the epoch).
    pub first_start: Option<f64>,
    /// Every `job_start` (seconds since the epoch).
    pub starts_at: Vec<f64>,
}

/// Each job's records in one node's audit log.
pub fn records(log: &Path, checks: &mut Checks) -> Result<BTreeMap<u64, JobRecords>> {
    let text = fs::read_to_string(log).with_context(|| format!("read {}", log.display()))?;
    Ok(records_in(&text, log, checks))
}

/// Each job's records in `text`, one node's audit log (`log` names it in a failure).
fn records_in(text: &str, log: &Path, checks: &mut Checks) -> BTreeMap<u64, JobRecords> {
    let mut out: BTreeMap<u64, JobRecords> = BTreeMap::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            checks.fail(format!("{}: a line that is no JSON record", log.display()));
            continue;
        };
        let Some(job) = v["job_id"].as_u64() else {
            continue;
        };
        let r = out.entry(job).or_default();
        let us = v["duration_us"].as_u64();
        let mig = v["profile"].as_str().is_some_and(|p| !p.is_empty());
        match v["event"].as_str().unwrap_or_default() {
            "job_start" => {
                r.starts += 1;
                if r.open {
                    r.unended += 1;
                }
                r.open = true;
                checks.prolog_us.extend(us);
                if mig {
                    checks.prolog_mig_us.extend(us);
                } else {
                    checks.prolog_cpu_us.extend(us);
                }
                let t = v["time"].as_str().and_then(super::faults::record_epoch);
                r.first_start = earliest(r.first_start, t);
                r.starts_at.extend(t);
            }
            "job_end" => {
                r.ends += 1;
                r.open = false;
                checks.epilog_us.extend(us);
                if mig {
                    checks.epilog_mig_us.extend(us);
                } else {
                    checks.epilog_cpu_us.extend(us);
                }
            }
            "job_denied" => r.denied += 1,
            "rollback" => r.rollbacks += 1,
            "reconcile" => {
                r.reconciled += 1;
                r.reconciled_at
                    .extend(v["time"].as_str().and_then(super::faults::record_epoch));
            }
            _ => {}
        }
    }
    for r in out.values_mut() {
        if std::mem::take(&mut r.open) {
            r.unended += 1;
        }
    }
    out
}

/// Node names of a Slurm host list (`n1`, `n[1-2]`, `n[1,2]`); empty for `(null)`.
pub fn expand_nodes(list: &str) -> Vec<String> {
    if list.is_empty() || list == "(null)" {
        return Vec::new();
    }
    let Some((prefix, rest)) = list.split_once('[') else {
        return list.split(',').map(str::to_string).collect();
    };
    let inner = rest.trim_end_matches(']');
    let mut out = Vec::new();
    for part in inner.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().unwrap_or(0), b.parse().unwrap_or(0));
                out.extend((a..=b).map(|i| format!("{prefix}{i}")));
            }
            None => out.push(format!("{prefix}{part}")),
        }
    }
    out
}

/// Every check, after the cluster settled.
pub fn run(mn: &MultiNode, work: &Workload, faults: &[Fault], drains: &[Drain]) -> Result<Checks> {
    let mut c = Checks::default();
    for x in &work.wrongly_accepted {
        c.fail(x.clone());
    }
    for i in 0..mn.nodes.len() {
        leaks(mn, i, &mut c)?;
    }
    jobs(mn, work, faults, &mut c)?;
    compare_sacct(mn, work, faults, &mut c)?;
    verify(mn, &mut c)?;
    forwarded(mn, &mut c)?;
    for d in drains {
        c.count("drains checked", 1);
        if d.cause.is_none() {
            c.fail(format!(
                "{} was drained at {:.0} s ({:?}) and no injected fault explains it",
                d.node, d.at_s, d.reason
            ));
        }
    }
    attack(mn, &mut c)?;
    Ok(c)
}

/// What a job could leave on node `i`.
pub fn leaks(mn: &MultiNode, i: usize, c: &mut Checks) -> Result<()> {
    let node = &mn.nodes[i];
    let mut left = Vec::new();
    let tenancy = mn.node_cgroup(i).join("tenancy");
    for d in walk_dirs(&tenancy) {
        let name = d
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if name.starts_with("job_") {
            left.push(format!("cgroup {}", d.display()));
        }
    }
    c.count("cgroup trees looked at", 1);
    let mut nft = mn.node_cmd(i, "nft");
    nft.args(["list", "table", "inet", "tenancy"]);
    let o = nft.output()?;
    let table = String::from_utf8_lossy(&o.stdout).to_string();
    let mut set = String::new();
    for line in table.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("set ") {
            set = rest.trim_end_matches(" {").to_string();
        } else if line.starts_with("elements =") && set.starts_with("jobs") {
            left.push(format!("nft set {set}: {line}"));
        }
    }
    c.count("nft tables looked at", 1);
    for t in fs::read_dir(node.root.join("scratch"))?.flatten() {
        for e in fs::read_dir(t.path()).into_iter().flatten().flatten() {
            left.push(format!("scratch {}", e.path().display()));
        }
    }
    c.count("scratch roots looked at", 1);
    for f in walk_files(&node.root.join("state")) {
        let name = f
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if name.starts_with("job") && fs::metadata(&f).is_ok_and(|m| m.len() > 0) {
            left.push(format!("journal {}", f.display()));
        }
    }
    c.count("journal folders looked at", 1);
    let slurmd = mn.slurmd_pid(i);
    let forwarder = mn.forwarder_pid(i);
    for pid in mn.node_processes(i) {
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        // slurmd itself (a rebooted node's is the child of its time namespace's unshare), and
        // the node's audit forwarder.
        if Some(pid as u32) == slurmd || comm.trim() == "slurmd" || Some(pid as u32) == forwarder {
            continue;
        }
        left.push(format!("process {pid} ({})", comm.trim()));
    }
    c.count("process lists looked at", 1);
    let mut r = mn.node_cmd(i, artifact("tenancyctl")?);
    r.arg("--config").arg(&mn.tenancy_toml).arg("reconcile");
    let o = r.output()?;
    if !o.status.success() {
        left.push(format!(
            "`tenancyctl reconcile` finds work: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    c.count("reconcile dry runs", 1);
    if mn.gpus > 0 {
        left.extend(mig_instances(&node.nvml_state())?);
        c.count("NVML states looked at", 1);
    }
    for l in left {
        c.fail(format!("{}: left after the soak: {l}", node.name));
    }
    Ok(())
}

/// How long after Slurm's StartTime or EndTime (whole seconds) a job's prolog or epilog on a
/// node may run and still be that time's (slurmd gets the launch or the end a moment later).
pub const SCRIPT_LAG_S: f64 = 5.0;

/// The GPU and compute instances an NVML stand-in's state file holds (README's state file:
/// `gpus[].gis[].cis[]`), each named.
pub fn mig_instances(state: &Path) -> Result<Vec<String>> {
    let text = match fs::read_to_string(state) {
        Ok(t) => t,
        // No process asked NVML anything yet: the stand-in made no state, and no instance.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("read {}", state.display())),
    };
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("NVML stand-in state {}", state.display()))?;
    let mut out = Vec::new();
    for (g, gpu) in v["gpus"].as_array().into_iter().flatten().enumerate() {
        for gi in gpu["gis"].as_array().into_iter().flatten() {
            let cis: Vec<String> = gi["cis"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|ci| ci["id"].to_string())
                .collect();
            out.push(format!(
                "MIG GPU instance {} (profile id {}, start {}) on GPU {g} with compute \
                 instance(s) [{}]",
                gi["id"],
                gi["profile_id"],
                gi["start"],
                cis.join(", ")
            ));
        }
    }
    Ok(out)
}

/// Every job Slurm knows, against the nodes' records.
fn jobs(mn: &MultiNode, work: &Workload, faults: &[Fault], c: &mut Checks) -> Result<()> {
    let mut per_node = BTreeMap::new();
    for n in &mn.nodes {
        per_node.insert(
            n.name.clone(),
            records(&n.root.join("audit/audit.jsonl"), c)?,
        );
    }
    let mut s = mn.cmd("scontrol");
    s.args(["show", "job", "-o"]);
    let o = mn.run(s)?;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let mut failed_jobs = Vec::new();
    let (mut failed_before, mut last_id) = (c.failures.len(), None);
    for line in text.lines().filter(|l| l.starts_with("JobId=")) {
        let kv = parse_kv(line);
        let id: u64 = kv.get("JobId").and_then(|v| v.parse().ok()).unwrap_or(0);
        if c.failures.len() > failed_before {
            failed_jobs.extend(last_id);
        }
        failed_before = c.failures.len();
        last_id = Some((id, line));
        let state = kv.get("JobState").cloned().unwrap_or_default();
        c.states.insert(id, state.clone());
        c.count("jobs in Slurm", 1);
        *c.counts
            .entry(format!("jobs {}", state.to_lowercase()))
            .or_default() += 1;
        let nodes = expand_nodes(kv.get("NodeList").map_or("", String::as_str));
        let ran = !nodes.is_empty() && kv.get("StartTime").is_some_and(|t| t != "Unknown");
        // A requeued job may run again on other nodes: its records on every node.
        let mut total = JobRecords::default();
        for m in per_node.values() {
            if let Some(r) = m.get(&id) {
                total.starts += r.starts;
                total.ends += r.ends;
                total.first_start = earliest(total.first_start, r.first_start);
            }
        }
        // The job's last run, in seconds since the epoch; `since`: its first (Slurm keeps the
        // last run's StartTime only, so from the start for a requeued job).
        let start = kv.get("StartTime").and_then(|t| slurm_epoch(t));
        let end = kv.get("EndTime").and_then(|t| slurm_epoch(t));
        let requeued = kv.get("Restarts").is_some_and(|r| r != "0");
        let since = if requeued { None } else { start };
        // A slurmctld SIGKILLed loses the last seconds of its state and gives their job ids
        // again: a node's records of this id from before the job was submitted are an
        // earlier job's, which Slurm forgot (and then aborted on the node, where slurmd,
        // taking the new job for the old one, may run neither's epilog). The two jobs' records
        // cannot be told apart: such an id is checked only for what it left (`leaks`).
        // When the soak ran sbatch for it (Slurm's SubmitTime moves with each requeue); an
        // array's elements by their array's id.
        let master = kv.get("ArrayJobId").and_then(|a| a.parse::<u64>().ok());
        let submitted = work
            .jobs
            .get(&id)
            .or_else(|| master.and_then(|m| work.jobs.get(&m)))
            .map(|s| s.submitted_at);
        if let (Some(first), Some(sub)) = (total.first_start, submitted) {
            if first < sub - 1.0 {
                let forgot = faults.iter().any(|f| {
                    f.hit && f.kind == FaultKind::SlurmctldKill && first <= f.wall && f.wall <= sub
                });
                if forgot {
                    c.excuse(id, "job ids given again after a slurmctld kill");
                    continue;
                }
                c.fail(format!(
                    "job {id} ({state}) has a job_start from before its submission, and no \
                     slurmctld kill between"
                ));
            }
        }
        // A requeued job's earlier runs may have been on other nodes than its last (Slurm's
        // NodeList): their job_start/job_end pairs are held too.
        let mut run_nodes = nodes.clone();
        if requeued {
            for (name, m) in &per_node {
                if m.get(&id).is_some_and(|r| r.starts > 0) && !run_nodes.contains(name) {
                    run_nodes.push(name.clone());
                }
            }
        }
        for n in &run_nodes {
            let in_last_run = nodes.contains(n);
            let r = per_node
                .get(n)
                .and_then(|m| m.get(&id))
                .cloned()
                .unwrap_or_default();
            // A hit fault of one of `kinds` on this node (slurmctld's, for SlurmctldKill) between
            // `from` and `to`.
            let fault_on = |kinds: &[FaultKind], from: Option<f64>, to: Option<f64>| {
                faults.iter().find(|f| {
                    f.hit
                        && kinds.contains(&f.kind)
                        && f.node.is_none_or(|i| mn.nodes[i].name == *n)
                        && from.is_none_or(|s| f.wall_until >= s - 1.0)
                        // Slurm's times are whole seconds: the end's second, all of it.
                        && to.is_none_or(|e| f.wall <= e + 1.0)
                })
            };
            // A hit audit_disk_full on this node while the job's prolog or epilog ran there, at
            // `at` (Slurm's StartTime or EndTime of the last run: to the second, the script up
            // to SCRIPT_LAG_S later); for a requeued job, whose earlier runs' times Slurm does
            // not keep, also any such window before the last run's start.
            let disk_full = |at: Option<f64>| {
                faults.iter().find(|f| {
                    f.hit
                        && f.kind == FaultKind::AuditDiskFull
                        && f.node.is_some_and(|i| mn.nodes[i].name == *n)
                        && (at
                            .is_some_and(|t| f.wall <= t + 1.0 + SCRIPT_LAG_S && t <= f.wall_until)
                            || (requeued && start.is_some_and(|s| f.wall <= s)))
                })
            };
            if r.unended > 0 && r.reconciled == 0 && disk_full(end).is_some() {
                // The epilog tore the job down (`leaks` finds nothing of it) and could not
                // write its job_end: it says so and exits 0 (ARCHITECTURE.md, "Epilog when the
                // audit log cannot be written").
                c.excuse(id, "job-nodes whose job_end the full audit disk kept out");
            } else if r.unended > 0 {
                // Slurm runs no epilog where slurmd died between the job's end and its epilog
                // (the restarted slurmd knows no such job): reconcile (tenancy-reconcile.timer,
                // a boot) tears the job down instead. Only such a fault explains it.
                let lost = fault_on(
                    &[
                        FaultKind::SlurmdKill,
                        FaultKind::NodeReboot,
                        FaultKind::EpilogKill,
                    ],
                    since,
                    end.map(|e| e + DRAIN_WINDOW_S),
                );
                match (r.reconciled > 0, lost) {
                    (true, Some(_)) => c.excuse(
                        id,
                        "job-nodes without their epilog, torn down by reconcile, behind a fault",
                    ),
                    (true, None) => c.fail(format!(
                        "job {id} ({state}) has {} run(s) without a job_end on {n} ({} job_start, \
                         {} job_end): reconcile tore it down, and no fault on {n} explains why \
                         its epilog did not",
                        r.unended, r.starts, r.ends
                    )),
                    (false, f) => c.fail(format!(
                        "job {id} ({state}) has {} run(s) without a job_end on {n} ({} job_start, \
                         {} job_end), and no reconcile (fault then: {})",
                        r.unended,
                        r.starts,
                        r.ends,
                        f.map_or("none".to_string(), |f| describe(mn, f))
                    )),
                }
            }
            if !in_last_run {
                // Slurm keeps the last run's times and nodes only: the rest is of that run.
                continue;
            }
            // reconcile keeps every job squeue lists on the node: never one Slurm still ran.
            if let (Some(s), Some(e)) = (start, end) {
                for t in r
                    .reconciled_at
                    .iter()
                    .filter(|t| s + 1.0 < **t && **t < e - 1.0)
                {
                    c.fail(format!(
                        "reconcile removed something of job {id} on {n} at {t:.0} while Slurm \
                         ran it there ({s:.0} to {e:.0})"
                    ));
                }
            }
            // A node a fault hit while the job was there (its prolog killed with it, before
            // its record) may have no record of it: no task of the job ran there (a step
            // there is refused without the prolog's journal).
            let behind_fault = fault_on(
                &[
                    FaultKind::SlurmdKill,
                    FaultKind::SlurmctldKill,
                    FaultKind::PrologKill,
                    FaultKind::NodeReboot,
                ],
                since,
                end,
            )
            .is_some();
            let seen = r.starts + r.ends + r.denied + r.rollbacks + r.reconciled > 0;
            if ran && !seen {
                if behind_fault {
                    c.excuse(id, "job-nodes without a record, behind a fault there");
                } else if disk_full(start).is_some() {
                    // The prolog could not write its job_start (or job_denied): it failed
                    // closed, rolled back (its rollback record kept out too), and Slurm
                    // drained the node; no task of the job ran there.
                    c.excuse(id, "job-nodes whose job_start the full audit disk kept out");
                } else {
                    c.fail(format!(
                        "job {id} ({state}) ran on {n} and has no record there"
                    ));
                }
            } else if state == "COMPLETED" && r.starts == 0 && behind_fault {
                c.excuse(
                    id,
                    "completed job-nodes without a job_start, behind a fault there (no task \
                     ran there)",
                );
            } else if state == "COMPLETED" && r.starts == 0 {
                // Slurm 22.05's slurmd keeps a requeued job's revoked credential when its next
                // run comes within 2 s of another credential scan (slurm_cred.c's scan backoff,
                // removed in 23.02): it takes the run for one it has seen and runs no prolog.
                // The node's tasks of that run are refused (no journal), so a job that still
                // completed ran nothing there but its batch script elsewhere: counted, as long
                // as this node ended an earlier run (it held the credential: a `job_end` for
                // that run and one for this) and is not the batch host.
                let batch_host = kv.get("BatchHost").is_some_and(|b| b == n);
                if requeued && r.ends >= 2 && !batch_host && slurm_major(mn) == Some(22) {
                    c.excuse(
                        id,
                        "job-nodes of a requeued job where Slurm 22.05 ran no prolog (tasks \
                         refused there)",
                    );
                } else {
                    c.fail(format!(
                        "job {id} completed on {n} without a job_start there"
                    ));
                }
            }
        }
        if ran {
            c.count("jobs that ran, checked node by node", 1);
        }
        if total.starts > 0 {
            c.count("jobs started", 1);
            c.first_starts.extend(total.first_start);
        }
        let sub = work.jobs.get(&id);
        if sub
            .is_some_and(|s| s.kind == JobKind::Requeue && s.acted_in.as_deref() == Some("RUNNING"))
            && state == "COMPLETED"
        {
            // Slurm shows the job RUNNING while its prolog runs: a requeue that came before
            // the first job_start leaves one run to record.
            let after_start = sub
                .and_then(|s| s.acted_at)
                .zip(total.first_start)
                .is_some_and(|(acted, first)| first < acted);
            if !after_start {
                c.count("jobs requeued in their first prolog, completed", 1);
            } else {
                c.count("jobs requeued while running, completed", 1);
            }
            if after_start && total.starts < 2 {
                c.fail(format!(
                    "job {id} was requeued while it ran and completed, with {} job_start in all",
                    total.starts
                ));
            }
        }
    }
    if c.failures.len() > failed_before {
        failed_jobs.extend(last_id);
    }
    record_counts(&per_node, &text, faults, c);
    for (id, line) in failed_jobs.into_iter().take(5) {
        let d = explain(mn, work, faults, id, line);
        c.details.push(d);
    }
    Ok(())
}

/// `tenancyctl report --compare-sacct` over every node's log for the soak's time: Slurm's
/// accounting (slurmdbd) and the audit logs agree on every job that completed, unless a fault
/// explains its records' want (`Checks::excused`); a disagreement on another job (cancelled,
/// failed, requeued by a fault) is one the node-by-node checks of `jobs` already judged.
/// A SIGKILLed slurmctld forgets its last seconds, its jobs' runs then among them (it runs
/// them again): such a run's `job_start` has no run in sacct on its node, and is counted.
fn compare_sacct(mn: &MultiNode, work: &Workload, faults: &[Fault], c: &mut Checks) -> Result<()> {
    let Some((first, _)) = work.submitting else {
        return Ok(());
    };
    // slurmctld sends a job's end to slurmdbd after the job ends: wait until sacct shows
    // no job running or pending (a SIGKILLed slurmctld may have lost some: then 60 s).
    let since = super::faults::rfc3339(first - 120.0);
    // sacct takes no zone in its times: UTC, told by TZ.
    let sacct_since = since.trim_end_matches('Z').to_string();
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        let mut q = mn.cmd("sacct");
        q.env("TZ", "UTC").args([
            "-a",
            "-X",
            "-n",
            "-s",
            "R,PD,CF",
            "-o",
            "JobIDRaw",
            "-S",
            &sacct_since,
        ]);
        if mn
            .run(q)
            .is_ok_and(|o| o.status.success() && o.stdout.iter().all(u8::is_ascii_whitespace))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // Slurm's runs by state (`sacct -D`: a requeued job's every run), and the preemptions
    // slurmctld made for a `soakhigh` job.
    let mut p = mn.cmd("sacct");
    p.env("TZ", "UTC").args([
        "-a",
        "-X",
        "-D",
        "-n",
        "-P",
        "-o",
        "State",
        "-S",
        &sacct_since,
    ]);
    if let Ok(o) = mn.run(p) {
        for state in String::from_utf8_lossy(&o.stdout).lines() {
            let state = state.split_whitespace().next().unwrap_or_default();
            if !state.is_empty() {
                c.count(&format!("sacct runs {}", state.to_lowercase()), 1);
            }
        }
    }
    let ctld = fs::read_to_string(mn.path("log/slurmctld.log")).unwrap_or_default();
    c.count(
        "jobs preempted for a soakhigh job (requeued)",
        ctld.lines()
            .filter(|l| l.contains("has been requeued to reclaim resources"))
            .count(),
    );
    let until = super::faults::rfc3339(super::faults::epoch_now() + 60.0);
    let mut r = mn.cmd(artifact("tenancyctl")?);
    r.arg("--config").arg(&mn.tenancy_toml).args([
        "report",
        "--compare-sacct",
        "--since",
        &since,
        "--until",
        &until,
        "--format",
        "json",
    ]);
    for n in &mn.nodes {
        r.arg(n.root.join("audit/audit.jsonl"));
    }
    let o = mn.run(r)?;
    let doc: serde_json::Value = match serde_json::from_slice(&o.stdout) {
        Ok(v) if matches!(o.status.code(), Some(0 | 1)) => v,
        _ => {
            c.fail(format!(
                "tenancyctl report --compare-sacct did not run ({}): {}{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ));
            return Ok(());
        }
    };
    c.count("compare-sacct runs", 1);
    c.count(
        "jobs in Slurm's accounting",
        doc["slurm_jobs"].as_u64().unwrap_or(0) as usize,
    );
    let mut per_node = BTreeMap::new();
    let mut ignored = Checks::default();
    for n in &mn.nodes {
        per_node.insert(
            n.name.clone(),
            records(&n.root.join("audit/audit.jsonl"), &mut ignored)?,
        );
    }
    // A run of `id` on `node` that started before a SIGKILL of slurmctld, within the state it
    // may lose (it saves its state every few seconds; a margin for the run's own length).
    let forgotten = |id: u64, node: &str| {
        per_node
            .get(node)
            .and_then(|m| m.get(&id))
            .is_some_and(|r| {
                r.starts_at.iter().any(|t| {
                    faults.iter().any(|f| {
                        f.hit
                            && f.kind == FaultKind::SlurmctldKill
                            && *t <= f.wall
                            && f.wall - t < DRAIN_WINDOW_S
                    })
                })
            })
    };
    let mut disagreeing = BTreeSet::new();
    let mut explained = 0;
    for d in doc["disagreements"].as_array().into_iter().flatten() {
        let id = d["job_id"].as_u64().unwrap_or(0);
        disagreeing.insert(id);
        // The run the disagreement is about, or the job's last as slurmctld has it.
        let completed = match d["state"].as_str() {
            Some(s) if !s.is_empty() => s == "COMPLETED",
            _ => c.states.get(&id).is_some_and(|s| s == "COMPLETED"),
        };
        let node = d["node"].as_str().unwrap_or("?");
        // Slurm counts more than the audit log for a job with a run a SIGKILLed slurmctld
        // lost the end of: recovered as running (or pending, and run again), the run is
        // ended only when the node's next registration shows it gone (up to 20 pings,
        // 200 s here) or at the next run's start, while the audit log has the slice's
        // real time (docs/admin-guide.md).
        let over_counted = d["kind"] == "usage_differs"
            && d["slurm_ms"].as_u64() > d["audit_ms"].as_u64()
            && node.split(',').any(|n| forgotten(id, n));
        if d["kind"] == "no_slurm_job" && forgotten(id, node) {
            c.count(
                "compare-sacct: runs a SIGKILLed slurmctld forgot (in the audit log, not in sacct)",
                1,
            );
        } else if over_counted {
            c.count(
                "compare-sacct: usage Slurm over-counts for a run a SIGKILLed slurmctld lost \
                 the end of",
                1,
            );
        } else if completed && !c.excused.contains(&id) {
            c.fail(format!(
                "report --compare-sacct: job {id} on {}: {}: {}",
                d["node"].as_str().unwrap_or("?"),
                d["kind"].as_str().unwrap_or("?"),
                d["detail"].as_str().unwrap_or("?")
            ));
            // The soak's cluster is gone once it ends: its records and log lines of the job
            // go into the summary now (Slurm's line is gone too, long since completed).
            if explained < 5 {
                explained += 1;
                c.details.push(explain(mn, work, faults, id, ""));
            }
        } else {
            c.count(
                "compare-sacct disagreements on jobs the node checks judged (not completed, \
                 or behind a fault)",
                1,
            );
        }
    }
    let agreed = c
        .states
        .iter()
        .filter(|(id, s)| *s == "COMPLETED" && !disagreeing.contains(id))
        .count();
    c.count(
        "completed jobs on which the audit logs and sacct agree",
        agreed,
    );
    Ok(())
}

/// A failed job looked into: the soak's submission, Slurm's line, each node's records of it,
/// the faults, and the daemons' log lines that name it.
fn explain(mn: &MultiNode, work: &Workload, faults: &[Fault], id: u64, line: &str) -> String {
    use std::fmt::Write;
    let mut d = format!("job {id}\n");
    let kv = parse_kv(line);
    let master = kv.get("ArrayJobId").and_then(|a| a.parse::<u64>().ok());
    if let Some(s) = work
        .jobs
        .get(&id)
        .or_else(|| master.and_then(|m| work.jobs.get(&m)))
    {
        let _ = writeln!(
            d,
            "  submitted: {} for {}{} at {:.1}, acted on in {:?} at {:?}",
            s.kind.name(),
            s.tenant,
            s.mig
                .as_ref()
                .map_or(String::new(), |p| format!(" with a MIG slice {p}")),
            s.submitted_at,
            s.acted_in,
            s.acted_at
        );
    }
    let keys = [
        "JobState",
        "Reason",
        "Restarts",
        "ArrayJobId",
        "ArrayTaskId",
        "SubmitTime",
        "StartTime",
        "EndTime",
        "NodeList",
        "BatchHost",
        "Requeue",
        "ExitCode",
    ];
    let slurm: Vec<String> = keys
        .iter()
        .filter_map(|k| kv.get(*k).map(|v| format!("{k}={v}")))
        .collect();
    let _ = writeln!(d, "  slurm: {}", slurm.join(" "));
    for f in faults.iter().filter(|f| f.hit) {
        let _ = writeln!(
            d,
            "  fault: {} (epoch {:.1} to {:.1})",
            describe(mn, f),
            f.wall,
            f.wall_until
        );
    }
    let names = [
        format!("JobId={id} "),
        format!("JobId={id}\n"),
        format!("job {id} "),
        format!("job {id}:"),
        format!("job {id}\n"),
        format!("jobid {id} "),
        format!("job_id\":{id},"),
        format!("StepId={id}."),
        format!("job {id}'s"),
        format!("JobId={id}."),
    ];
    let names_it = |l: &str| {
        let l = format!("{l}\n");
        names.iter().any(|n| l.contains(n.as_str()))
    };
    for n in &mn.nodes {
        let log = fs::read_to_string(n.root.join("audit/audit.jsonl")).unwrap_or_default();
        for l in log.lines().filter(|l| names_it(l)) {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
            let _ = writeln!(
                d,
                "  {} record: {} {} {} {}",
                n.name,
                v["time"].as_str().unwrap_or("?"),
                v["event"].as_str().unwrap_or("?"),
                v["outcome"].as_str().unwrap_or("?"),
                v["reason"].as_str().unwrap_or("")
            );
        }
    }
    let logs = mn.dir.path().join("log");
    let mut files: Vec<_> = fs::read_dir(&logs)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    for f in files {
        let text = fs::read_to_string(&f).unwrap_or_default();
        let hits: Vec<&str> = text.lines().filter(|l| names_it(l)).collect();
        let name = f
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        // The first and last lines: where the job came and went.
        let (head, tail) = if hits.len() > 40 {
            (20, hits.len() - 20)
        } else {
            (hits.len(), hits.len())
        };
        for l in hits[..head].iter().chain(&hits[tail..]) {
            let _ = writeln!(d, "  {name}: {l}");
        }
        if tail > head {
            let _ = writeln!(d, "  {name}: ({} lines more)", tail - head);
        }
    }
    d
}

/// The major release of the cluster's Slurm (`scontrol -V`: "slurm-wlm 22.05.8", "slurm 24.11.1").
fn slurm_major(mn: &MultiNode) -> Option<u32> {
    let mut v = mn.cmd("scontrol");
    v.arg("-V");
    let o = mn.run(v).ok()?;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let release = text.split_whitespace().nth(1)?;
    release.split('.').next()?.parse().ok()
}

/// The earlier of two times, either of which may be unknown.
fn earliest(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A fault as the failures name it.
fn describe(mn: &MultiNode, f: &Fault) -> String {
    format!(
        "{} on {} at {:.0} s",
        f.kind,
        f.node
            .map_or("slurmctld".to_string(), |i| mn.nodes[i].name.clone()),
        f.at_s
    )
}

/// The records of every node counted, and none of a job Slurm does not know, but for a job a
/// SIGKILLed slurmctld forgot: each of its runs on the node started before a kill, within
/// the state slurmctld may lose (as `compare_sacct` has it), and no later job was given its
/// id again. What such a job left on the node is `leaks`' to judge.
fn record_counts(
    per_node: &BTreeMap<String, BTreeMap<u64, JobRecords>>,
    jobs: &str,
    faults: &[Fault],
    c: &mut Checks,
) {
    let forgotten = |r: &JobRecords| {
        !r.starts_at.is_empty()
            && r.starts_at.iter().all(|t| {
                faults.iter().any(|f| {
                    f.hit
                        && f.kind == FaultKind::SlurmctldKill
                        && *t <= f.wall
                        && f.wall - t < DRAIN_WINDOW_S
                })
            })
    };
    for (node, m) in per_node {
        for (id, r) in m {
            c.count("job_start records", r.starts);
            c.count("job_end records", r.ends);
            c.count("job_denied records", r.denied);
            if r.starts > 0 && !jobs.contains(&format!("JobId={id} ")) {
                if forgotten(r) {
                    c.count(
                        "job-nodes of jobs a SIGKILLed slurmctld forgot (no id given again)",
                        1,
                    );
                    continue;
                }
                c.fail(format!(
                    "{node} has records of job {id}, which Slurm does not know"
                ));
            }
        }
    }
}

/// With the collector: every record of every node reached it, byte for byte, its copies
/// verify (`audit verify` skips the copies a resend makes), and each forwarder still runs
/// (a collector down kills no forwarder).
pub fn forwarded(mn: &MultiNode, c: &mut Checks) -> Result<()> {
    let Some(r) = &mn.collector else {
        return Ok(());
    };
    for (i, n) in mn.nodes.iter().enumerate() {
        let local = fs::read_to_string(n.root.join("audit/audit.jsonl"))?;
        let want: BTreeSet<&str> = local.lines().collect();
        let t = std::time::Instant::now();
        let missing = loop {
            let copy = fs::read_to_string(r.records(&n.name)).unwrap_or_default();
            let got: BTreeSet<&str> = copy.lines().collect();
            let missing = want.iter().filter(|l| !got.contains(*l)).count();
            if missing == 0 || t.elapsed() > Duration::from_secs(120) {
                break missing;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        c.count("records at the collector", want.len() - missing);
        if missing > 0 {
            c.fail(format!(
                "{}: {missing} of {} records never reached the collector within 120 s (see {})",
                n.name,
                want.len(),
                mn.path(&format!("log/forward-{}.out", n.name)).display()
            ));
        }
        let forwarder_runs = mn
            .forwarder_pid(i)
            .is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !forwarder_runs {
            c.fail(format!("{}: the audit forwarder is not running", n.name));
        }
        let mut v = mn.node_cmd(i, artifact("tenancyctl")?);
        v.arg("--config")
            .arg(&mn.tenancy_toml)
            .args(["audit", "verify"])
            .arg(r.records(&n.name));
        let o = v.output()?;
        c.count("collector copies verified", 1);
        if !o.status.success() {
            c.fail(format!(
                "{}: audit verify of the collector's copy: {}{}",
                n.name,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ));
        }
    }
    Ok(())
}

/// `tenancyctl audit verify --all-nodes` over every node's log.
pub fn verify(mn: &MultiNode, c: &mut Checks) -> Result<()> {
    let mut v = std::process::Command::new(artifact("tenancyctl")?);
    v.arg("--config")
        .arg(&mn.tenancy_toml)
        .args(["audit", "verify", "--all-nodes"]);
    for n in &mn.nodes {
        v.arg(n.root.join("audit/audit.jsonl"));
    }
    let o = v.output()?;
    c.count("audit verify runs", 1);
    if !o.status.success() {
        c.fail(format!(
            "audit verify --all-nodes: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(())
}

/// The multi-node suite's cross-node attack, after the soak: globex's job on both nodes
/// serves; acme's job on each node connects to it on the other (TCP and UDP). Every probe
/// must fail, while a process outside every job reaches the listener.
pub fn attack(mn: &MultiNode, c: &mut Checks) -> Result<()> {
    let (acme1, globex1) = (&mn.tenants.acme1, &mn.tenants.globex1);
    let sdir = mn.user_dir(globex1).join("soak-serve");
    let pdir = mn.user_dir(acme1).join("soak-probe");
    for (d, u) in [(&sdir, globex1), (&pdir, acme1)] {
        fs::create_dir_all(d)?;
        nix::unistd::chown(
            d.as_path(),
            Some(nix::unistd::Uid::from_raw(u.uid)),
            Some(nix::unistd::Gid::from_raw(u.gid)),
        )?;
    }
    let port = "7346";
    let stop = sdir.join("stop");
    let sid = mn.sbatch(
        globex1,
        "globex",
        &[],
        &[
            "serve",
            port,
            stop.to_str().unwrap_or_default(),
            sdir.to_str().unwrap_or_default(),
        ],
    )?;
    for n in &mn.nodes {
        mn.wait_file_line(
            &sdir.join(format!("serve-{}.txt", n.name)),
            "listening=",
            Duration::from_secs(120),
        )?;
    }
    let mut control = mn.node_cmd(0, "/usr/bin/python3");
    control
        .arg(mn.net_task())
        .args(["probe", pdir.to_str().unwrap_or_default(), port])
        .env("TARGETS_n1", "control=n2");
    control.status()?;
    let ctl = probe_kv(&fs::read_to_string(pdir.join("probe-x-n1.txt")).unwrap_or_default());
    let env = [
        ("TARGETS_n1", "peer=n2".to_string()),
        ("TARGETS_n2", "peer=n1".to_string()),
    ];
    let pid = mn.sbatch(
        acme1,
        "acme",
        &env,
        &["probe", pdir.to_str().unwrap_or_default(), port],
    )?;
    let info = mn.wait_job_done(pid, Duration::from_secs(120))?;
    fs::write(&stop, "")?;
    let _ = mn.wait_job_done(sid, Duration::from_secs(60));
    c.count("isolation attacks after the soak", 1);
    if !ctl.get("control.tcp").is_some_and(|v| v.starts_with("ok")) {
        c.fail(format!(
            "the attack's control did not reach globex's listener: {ctl:?}"
        ));
    }
    if info.get("JobState").map(String::as_str) != Some("COMPLETED") {
        c.fail(format!("the attacking job did not complete: {info:?}"));
    }
    for n in &mn.nodes {
        let r = probe_kv(
            &fs::read_to_string(pdir.join(format!("probe-{pid}-{}.txt", n.name)))
                .unwrap_or_default(),
        );
        for proto in ["tcp", "udp"] {
            let got = r.get(&format!("peer.{proto}")).cloned().unwrap_or_default();
            if got.is_empty() || got.starts_with("ok") {
                c.fail(format!(
                    "after the soak, acme's job on {} reached globex's job over {proto}: {got:?}",
                    n.name
                ));
            }
        }
    }
    Ok(())
}

fn walk_dirs(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(e.path());
                stack.push(e.path());
            }
        }
    }
    out
}

fn walk_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => out.push(e.path()),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One record of job 2892 on n1, `secs` seconds into the minute.
    fn record(event: &str, secs: u32, reason: &str) -> String {
        format!(
            r#"{{"job_id":2892,"node":"n1","event":"{event}","time":"2026-12-04T19:36:{secs:02}.000000Z","reason":"{reason}"}}"#
        )
    }

    fn n1(lines: &[String]) -> JobRecords {
        let mut c = Checks::default();
        let out = records_in(&lines.join("\n"), Path::new("n1/audit.jsonl"), &mut c);
        assert!(c.failures.is_empty(), "{:?}", c.failures);
        out[&2892].clone()
    }

    #[test]
    fn a_job_end_of_a_run_with_no_journal_does_not_end_the_next_run() {
        // The first run's prolog rolled back (its epilog finds no journal and says so in a
        // job_end), the second's job_end never written (the full audit disk): one run unended,
        // though the log holds one job_start and one job_end.
        let r = n1(&[
            record("rollback", 1, "audit log full"),
            record(
                "job_end",
                2,
                "no journal: the prolog made nothing for this job",
            ),
            record("job_start", 10, ""),
        ]);
        assert_eq!((r.starts, r.ends, r.unended), (1, 1, 1));
    }

    #[test]
    fn an_epilog_run_twice_ends_one_run_and_a_start_after_a_start_leaves_one_open() {
        // Slurm 22.05 runs an epilog again after a slurmd restart: the second job_end (no
        // journal by then) ends nothing, and the requeued run's job_start is ended by its own.
        let r = n1(&[
            record("job_start", 1, ""),
            record("job_end", 2, ""),
            record(
                "job_end",
                3,
                "no journal: the prolog made nothing for this job",
            ),
            record("job_start", 10, ""),
            record("job_end", 12, ""),
        ]);
        assert_eq!((r.starts, r.ends, r.unended), (2, 3, 0));
        // A run whose epilog was lost before the job ran again: the first start is unended.
        let r = n1(&[
            record("job_start", 1, ""),
            record("job_start", 10, ""),
            record("job_end", 12, ""),
        ]);
        assert_eq!((r.starts, r.ends, r.unended), (2, 1, 1));
    }
}
