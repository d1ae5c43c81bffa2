//! The soak's faults, at random times: slurmd or slurmctld SIGKILLed and started again, a
//! prolog or epilog SIGKILLed, a node rebooted ([`MultiNode::reboot`]), a node's audit file
//! system full for a few seconds ([`MultiNode::fill_audit_disk`]), the audit collector
//! SIGKILLed and started again. Drained nodes are noted with their reason, tied to the fault
//! that caused them, and resumed.

use super::Plan;
use crate::{parse_kv, MultiNode};
use anyhow::{bail, Result};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    SlurmdKill,
    SlurmctldKill,
    PrologKill,
    EpilogKill,
    NodeReboot,
    /// The audit collector SIGKILLed (what it had not written is lost) and started again a
    /// few seconds later: the forwarders send again from what it confirmed.
    CollectorDown,
    /// The node's audit file system full (ENOSPC) from `wall` to `wall_until`: its prologs
    /// fail closed (Slurm drains the node), its epilogs tear down without their record.
    AuditDiskFull,
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FaultKind::SlurmdKill => "slurmd_kill",
            FaultKind::SlurmctldKill => "slurmctld_kill",
            FaultKind::PrologKill => "prolog_kill",
            FaultKind::EpilogKill => "epilog_kill",
            FaultKind::NodeReboot => "node_reboot",
            FaultKind::CollectorDown => "collector_down",
            FaultKind::AuditDiskFull => "audit_disk_full",
        })
    }
}

/// One injected fault.
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: FaultKind,
    /// The node it hit (None: slurmctld, or the collector beside it).
    pub node: Option<usize>,
    /// Seconds into the soak it began and ended.
    pub at_s: f64,
    pub until_s: f64,
    /// Whether it found its target (a prolog or epilog to kill was running; the audit file
    /// system was filled to its last block).
    pub hit: bool,
    /// When it began and ended, in seconds since the epoch.
    pub wall: f64,
    pub wall_until: f64,
}

/// Now, in seconds since the epoch.
pub fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A time as Slurm writes it (`2026-12-02T12:55:46`, local time), in seconds since the epoch.
pub fn slurm_epoch(t: &str) -> Option<f64> {
    let tm = parse_tm(t)?;
    let mut tm = tm;
    tm.tm_isdst = -1;
    // SAFETY: mktime reads and normalises `tm`, which outlives the call.
    let s = unsafe { libc::mktime(&mut tm) };
    (s != -1).then_some(s as f64)
}

/// An audit record's `time` (RFC 3339, UTC), in seconds since the epoch.
pub fn record_epoch(t: &str) -> Option<f64> {
    let mut tm = parse_tm(t.get(..19)?)?;
    // SAFETY: timegm reads `tm`, which outlives the call.
    let s = unsafe { libc::timegm(&mut tm) };
    let frac = t
        .get(19..)
        .and_then(|r| r.strip_prefix('.'))
        .map(|r| r.trim_end_matches(|c: char| !c.is_ascii_digit()))
        .and_then(|d| format!("0.{d}").parse::<f64>().ok())
        .unwrap_or(0.0);
    (s != -1).then_some(s as f64 + frac)
}

/// Seconds since the epoch as RFC 3339 (UTC, whole seconds), as tenancyctl takes bounds.
pub fn rfc3339(epoch: f64) -> String {
    let t = epoch.floor() as libc::time_t;
    // SAFETY: a zeroed tm is a valid value of the plain C struct; gmtime_r writes it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    unsafe { libc::gmtime_r(&t, &mut tm) };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

fn parse_tm(t: &str) -> Option<libc::tm> {
    let b = t.as_bytes();
    if b.len() != 19 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| t.get(r)?.parse::<i32>().ok();
    // SAFETY: a zeroed tm is a valid value of the plain C struct.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = n(0..4)? - 1900;
    tm.tm_mon = n(5..7)? - 1;
    tm.tm_mday = n(8..10)?;
    tm.tm_hour = n(11..13)?;
    tm.tm_min = n(14..16)?;
    tm.tm_sec = n(17..19)?;
    Some(tm)
}

/// A node seen drained or down, and the fault it is tied to.
#[derive(Debug, Clone)]
pub struct Drain {
    pub node: String,
    pub at_s: f64,
    pub reason: String,
    /// The fault that explains it (`<kind> on <node> at <s> s`), None when none does.
    pub cause: Option<String>,
}

/// How long after a fault a drain is still its doing (Slurm notices a killed prolog's node
/// at the job's next message).
pub const DRAIN_WINDOW_S: f64 = 90.0;

/// How long a node's audit disk stays full: 3 to 8 s.
pub const DISK_FULL_MS: std::ops::RangeInclusive<u64> = 3000..=8000;

pub struct Injector {
    every: Option<Duration>,
    nodes: usize,
    /// Why `audit_disk_full` is skipped (the nodes have no audit disk of their own).
    pub disk_full_skipped: Option<String>,
    next: Option<f64>,
    /// Kinds not injected yet: the first faults take each once, in a random order, so that
    /// even a short soak meets every kind; then each fault's kind is drawn by its share.
    unmet: Vec<FaultKind>,
    pub faults: Vec<Fault>,
    drains: Vec<Drain>,
}

impl Injector {
    pub fn new(plan: &Plan, mn: &MultiNode) -> Injector {
        let disk_full_skipped = (!mn.has_audit_disks()).then(|| {
            let why = mn
                .audit_disk_missing
                .clone()
                .unwrap_or_else(|| "the cluster was started without Options::audit_disk".into());
            eprintln!("soak: WARNING: the audit_disk_full fault is SKIPPED: {why}");
            why
        });
        let mut unmet = vec![
            FaultKind::SlurmdKill,
            FaultKind::SlurmctldKill,
            FaultKind::PrologKill,
            FaultKind::EpilogKill,
            FaultKind::NodeReboot,
        ];
        if mn.collector.is_some() {
            unmet.push(FaultKind::CollectorDown);
        }
        if disk_full_skipped.is_none() {
            unmet.push(FaultKind::AuditDiskFull);
        }
        fastrand::Rng::with_seed(plan.seed).shuffle(&mut unmet);
        Injector {
            every: plan.fault_every,
            nodes: mn.nodes.len(),
            disk_full_skipped,
            next: plan.fault_every.map(|d| d.as_secs_f64() / 2.0),
            unmet,
            faults: Vec::new(),
            drains: Vec::new(),
        }
    }

    /// The fault that is due, if any, then the drains.
    pub fn round(
        &mut self,
        mn: &mut MultiNode,
        rng: &mut fastrand::Rng,
        start: Instant,
    ) -> Result<()> {
        let now = start.elapsed().as_secs_f64();
        if let (Some(every), Some(next)) = (self.every, self.next) {
            if now >= next {
                let drawn = pick(
                    rng,
                    self.disk_full_skipped.is_none(),
                    mn.collector.is_some(),
                );
                let kind = self.unmet.pop().unwrap_or(drawn);
                let node = rng.usize(0..self.nodes);
                let hold = Duration::from_millis(rng.u64(DISK_FULL_MS));
                let f = inject(mn, kind, node, start, hold)?;
                self.faults.push(f);
                // Exponential gaps around the mean.
                let gap = -every.as_secs_f64() * (1.0 - rng.f64()).ln();
                self.next = Some(
                    start.elapsed().as_secs_f64() + gap.clamp(1.0, 10.0 * every.as_secs_f64()),
                );
            }
        }
        self.drains.extend(resume_drained(mn, &self.faults, start)?);
        Ok(())
    }

    /// The drains seen so far.
    pub fn take_drains(&mut self) -> Vec<Drain> {
        std::mem::take(&mut self.drains)
    }
}

/// The next fault's kind by its share (a node reboot in place of a kind the cluster lacks).
fn pick(rng: &mut fastrand::Rng, disk_full: bool, collector: bool) -> FaultKind {
    match rng.u32(0..100) {
        0..=18 => FaultKind::SlurmdKill,
        19..=33 => FaultKind::SlurmctldKill,
        34..=54 => FaultKind::PrologKill,
        55..=76 => FaultKind::EpilogKill,
        85..=91 if disk_full => FaultKind::AuditDiskFull,
        92..=99 if collector => FaultKind::CollectorDown,
        _ => FaultKind::NodeReboot,
    }
}

/// Injects `kind` on `node` (slurmctld for [`FaultKind::SlurmctldKill`]); a lasting fault
/// ([`FaultKind::AuditDiskFull`]) lasts `hold`.
pub fn inject(
    mn: &mut MultiNode,
    kind: FaultKind,
    node: usize,
    start: Instant,
    hold: Duration,
) -> Result<Fault> {
    let at_s = start.elapsed().as_secs_f64();
    let wall = epoch_now();
    let mut hit = true;
    match kind {
        FaultKind::SlurmdKill => {
            mn.kill_slurmd(node);
            std::thread::sleep(Duration::from_millis(500));
            mn.start_slurmd(node)?;
        }
        FaultKind::SlurmctldKill => {
            mn.kill_slurmctld();
            std::thread::sleep(Duration::from_millis(500));
            mn.start_slurmctld()?;
            wait_controller(mn, Duration::from_secs(60))?;
        }
        FaultKind::PrologKill => hit = kill_program(mn, node, "tenancy-prolog"),
        FaultKind::EpilogKill => hit = kill_program(mn, node, "tenancy-epilog"),
        FaultKind::NodeReboot => mn.reboot(node)?,
        FaultKind::CollectorDown => match mn.collector.as_mut() {
            Some(r) => {
                r.crash();
                std::thread::sleep(Duration::from_secs(5));
                r.resume();
            }
            None => hit = false,
        },
        FaultKind::AuditDiskFull => {
            // The filler goes again also when filling failed half-way.
            let filled = mn.fill_audit_disk(node);
            if filled.is_ok() {
                std::thread::sleep(hold);
            }
            mn.free_audit_disk(node)?;
            if let Err(e) = &filled {
                eprintln!("soak: audit_disk_full on node {node} did not fill it: {e:#}");
            }
            hit = filled.is_ok();
        }
    }
    let on_node = !matches!(kind, FaultKind::SlurmctldKill | FaultKind::CollectorDown);
    Ok(Fault {
        kind,
        node: on_node.then_some(node),
        at_s,
        until_s: start.elapsed().as_secs_f64(),
        hit,
        wall,
        wall_until: epoch_now(),
    })
}

/// SIGKILLs the first process of `node` running `program` within 8 s; whether one was.
fn kill_program(mn: &MultiNode, node: usize, program: &str) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(8) {
        for pid in mn.node_processes(node) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == program {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Waits until slurmctld answers again.
pub fn wait_controller(mn: &MultiNode, timeout: Duration) -> Result<()> {
    let t = Instant::now();
    while t.elapsed() < timeout {
        let mut c = mn.cmd("scontrol");
        c.arg("ping");
        if mn
            .run(c)
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("UP"))
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!(
        "slurmctld did not answer within {timeout:?}; logs in {}",
        mn.path("log").display()
    )
}

/// Nodes drained or down now, noted with their reason and cause, and resumed.
fn resume_drained(mn: &MultiNode, faults: &[Fault], start: Instant) -> Result<Vec<Drain>> {
    let mut c = mn.cmd("scontrol");
    c.args(["show", "node", "-o"]);
    let Ok(o) = mn.run(c) else {
        return Ok(Vec::new());
    };
    if !o.status.success() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let kv = parse_kv(line);
        let state = kv.get("State").cloned().unwrap_or_default();
        if !(state.contains("DRAIN") || state.starts_with("DOWN") || state.contains("FAIL")) {
            continue;
        }
        let node = kv.get("NodeName").cloned().unwrap_or_default();
        let reason = line
            .split_once("Reason=")
            .map(|(_, r)| r.trim().to_string())
            .unwrap_or_default();
        let at_s = start.elapsed().as_secs_f64();
        let index = mn.nodes.iter().position(|n| n.name == node);
        let cause = faults
            .iter()
            .rev()
            .find(|f| {
                // A collector down never explains a drain: the job path does not wait on it.
                f.kind != FaultKind::CollectorDown
                    && (f.node.is_none() || f.node == index)
                    && f.at_s <= at_s
                    && at_s <= f.until_s + DRAIN_WINDOW_S
            })
            .map(|f| {
                format!(
                    "{} on {} at {:.0} s",
                    f.kind,
                    f.node
                        .map_or("slurmctld".into(), |i| mn.nodes[i].name.clone()),
                    f.at_s
                )
            });
        // The admin's runbook: what a killed prolog or epilog left is torn down before the
        // node takes jobs again.
        if let Some(i) = index {
            let _ = mn.tenancyctl(i, &["reconcile", "--apply"]);
        }
        let mut c = mn.cmd("scontrol");
        c.args(["update", &format!("nodename={node}"), "state=resume"]);
        let _ = mn.run(c);
        out.push(Drain {
            node,
            at_s,
            reason,
            cause,
        });
    }
    Ok(out)
}

/// After the last round: waits until no job is left (scancel'ing what is still there after
/// a while) and every node is idle, resuming drained ones; returns the drains seen meanwhile.
pub fn settle(mn: &MultiNode, faults: &[Fault], start: Instant) -> Result<Vec<Drain>> {
    let mut drains = Vec::new();
    let t = Instant::now();
    let mut cancelled = false;
    loop {
        wait_controller(mn, Duration::from_secs(60))?;
        drains.extend(resume_drained(mn, faults, start)?);
        let mut q = mn.cmd("squeue");
        q.args(["-h", "-o", "%A"]);
        let empty = mn
            .run(q)
            .is_ok_and(|o| o.status.success() && o.stdout.iter().all(u8::is_ascii_whitespace));
        let states = mn.node_states().unwrap_or_default();
        let idle = mn
            .nodes
            .iter()
            .all(|n| states.get(&n.name).is_some_and(|s| s == "idle"));
        if empty && idle {
            return Ok(drains);
        }
        if !cancelled && t.elapsed() > Duration::from_secs(180) {
            let mut c = mn.cmd("scancel");
            c.args(["--full", "--partition", "debug"]);
            let _ = mn.run(c);
            cancelled = true;
        }
        if t.elapsed() > Duration::from_secs(420) {
            bail!(
                "the cluster did not settle: queue empty {empty}, nodes {states:?}; logs in {}",
                mn.path("log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
