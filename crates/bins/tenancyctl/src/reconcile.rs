//! `tenancyctl reconcile [--apply]`: brings a node back to "every product resource belongs to a
//! job Slurm runs".
//!
//! 1. Journals of jobs Slurm no longer runs (asked with `squeue -h -o %A -w <node>` by absolute
//!    path) are torn down through the layers, exactly as the epilog would, in reverse order.
//!    Scratch job folders are judged against every job Slurm still has (`squeue -h -a -o %A`),
//!    as a scratch_root the nodes share holds the folders of jobs running elsewhere.
//!    When Slurm cannot be asked, no journal is touched, and the output says so.
//! 2. Product resources no journal owns are found: MIG GPU instances (NVML), product cgroups
//!    `<cgroup root>/tenancy/<tenant>/job_<id>` (cgroup2 and v1 devices), scratch job folders,
//!    and retained scratch folders past retention. What is named after a job whose journal
//!    cannot be read is kept, and MIG instances are not checked then (an instance names no job).
//!
//! Without `--apply` nothing changes (dry run). Everything runs under the node lock the prolog
//! takes, so no placement decision happens meanwhile, and Slurm is asked after the lock is held,
//! so a journal written by a prolog is always older than the answer. Every action is recorded in
//! the audit log (event `reconcile`).
//!
//! Exit status: 0 when the node is clean (or everything found was removed), 1 when something is
//! left (dry-run findings, failures, or a source that could not be checked).

use crate::output::Format;
use anyhow::Context;
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use tenancy_audit_log::{Event, Outcome, Record, Resource, ResourceAction};
use tenancy_config::{Config, Identity};
use tenancy_job::{Journal, JournalDir};
use tenancy_node::{layers, Claim, Layer, OrphanAction, OrphanScope};

use crate::output::Rows;

#[derive(clap::Args, Debug, Clone)]
pub struct ReconcileArgs {
    /// Remove what is found (default: dry run, report only)
    #[arg(long)]
    pub apply: bool,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// This node's Slurm name (default: the host's short name)
    #[arg(long)]
    pub node: Option<String>,
    /// squeue to ask which jobs run on the node (absolute path)
    #[arg(long, default_value = "/usr/bin/squeue", value_name = "PATH")]
    pub squeue: PathBuf,
    /// For tests and recovery without Slurm: the ids of the jobs that run on the node, one per
    /// line, instead of asking squeue
    #[arg(long, value_name = "FILE")]
    pub running_jobs_from: Option<PathBuf>,
    /// For tests and recovery without Slurm: the ids of every job Slurm still has in the
    /// cluster (on any node, pending included), one per line, instead of asking squeue
    /// (default with --running-jobs-from: that file's jobs)
    #[arg(long, value_name = "FILE")]
    pub known_jobs_from: Option<PathBuf>,
    /// Only look at these tenants' cgroups and scratch job folders (repeatable; default: all).
    /// Retained folders past retention are purged for every tenant regardless.
    #[arg(long = "tenant", value_name = "NAME")]
    pub tenants: Vec<String>,
}

/// One finding and what was (or would be) done about it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Row {
    /// journal, mig, cgroup, scratch, retained, slurm, nvml, audit, occupancy
    pub kind: String,
    pub job_id: Option<u64>,
    pub tenant: Option<String>,
    pub resource: String,
    pub finding: String,
    /// `would remove`, `removed`, `failed: ...`, `left: ...`, `none`
    pub action: String,
    #[serde(skip)]
    pub left: bool,
}

impl Row {
    fn new(kind: &str, resource: impl Into<String>, finding: impl Into<String>) -> Row {
        Row {
            kind: kind.into(),
            job_id: None,
            tenant: None,
            resource: resource.into(),
            finding: finding.into(),
            action: "none".into(),
            left: false,
        }
    }
    fn job(mut self, job: u64) -> Row {
        self.job_id = Some(job);
        self
    }
    fn tenant(mut self, t: &str) -> Row {
        self.tenant = Some(t.to_string());
        self
    }
    /// Left as it is, with the reason: makes the exit status 1.
    fn left(mut self, why: impl Into<String>) -> Row {
        self.action = format!("left: {}", why.into());
        self.left = true;
        self
    }
}

/// Which jobs Slurm runs on the node, or why it could not be asked.
fn running_jobs(args: &ReconcileArgs, node: &str) -> Result<BTreeSet<u64>, String> {
    match &args.running_jobs_from {
        Some(file) => job_ids_in_file(file),
        None => squeue_jobs(args, &["-h", "-o", "%A", "-w", node]),
    }
}

/// Every job Slurm still has in the cluster, on any node and in any state squeue lists
/// (pending, running, suspended, completing), or why it could not be asked. A scratch_root on
/// a file system the nodes share holds the folders of jobs that run on other nodes, which no
/// journal of this node owns.
fn known_jobs(args: &ReconcileArgs) -> Result<BTreeSet<u64>, String> {
    match (&args.known_jobs_from, &args.running_jobs_from) {
        (Some(file), _) | (None, Some(file)) => job_ids_in_file(file),
        (None, None) => squeue_jobs(args, &["-h", "-a", "-o", "%A"]),
    }
}

fn job_ids_in_file(file: &Path) -> Result<BTreeSet<u64>, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    job_ids(&text)
}

/// The job ids `squeue ARGS` prints, one per line.
fn squeue_jobs(args: &ReconcileArgs, squeue_args: &[&str]) -> Result<BTreeSet<u64>, String> {
    if !args.squeue.is_absolute() {
        return Err(format!(
            "--squeue {} is not an absolute path",
            args.squeue.display()
        ));
    }
    let out = Command::new(&args.squeue)
        .args(squeue_args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args.squeue.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {} failed ({}): {}",
            args.squeue.display(),
            squeue_args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    job_ids(&String::from_utf8(out.stdout).map_err(|_| "squeue printed non-UTF-8".to_string())?)
}

fn job_ids(text: &str) -> Result<BTreeSet<u64>, String> {
    let mut ids = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() {
            continue;
        }
        ids.insert(
            l.parse::<u64>()
                .map_err(|_| format!("line {}: '{l}' is not a job id", i + 1))?,
        );
    }
    Ok(ids)
}

pub(crate) fn short_hostname() -> anyhow::Result<String> {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("cannot read the host name; pass --node")?;
    Ok(h.trim().split('.').next().unwrap_or_default().to_string())
}

/// Who runs tenancyctl, for the audit records.
pub(crate) fn operator() -> (String, u32) {
    // /proc/self belongs to the effective uid.
    let uid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(u32::MAX);
    let user = Identity::from_uid(uid)
        .map(|i| i.user)
        .unwrap_or_else(|_| format!("uid{uid}"));
    (user, uid)
}

struct Ctx<'c> {
    config: &'c Config,
    node: String,
    apply: bool,
    user: String,
    uid: u32,
    tenants: Vec<String>,
    rows: Vec<Row>,
}

impl Ctx<'_> {
    /// Records one action; a failed append is reported as a row of its own.
    fn audit(&mut self, row: &Row, ok: bool) {
        let mut rec = Record::new(
            self.config.cluster.name.clone(),
            self.node.clone(),
            self.user.clone(),
            self.uid,
            Event::Reconcile,
            if ok {
                Outcome::Success
            } else {
                Outcome::Failure
            },
            "tenancyctl",
        )
        .resource(Resource::new(
            row.kind.clone(),
            ResourceAction::Removed,
            row.resource.clone(),
        ))
        .reason(format!("{}; {}", row.finding, row.action));
        if let Some(j) = row.job_id {
            rec = rec.job_id(j);
        }
        if let Some(t) = &row.tenant {
            rec = rec.tenant(t.clone());
        }
        let res = tenancy_job::audit::append_anchored(self.config, &mut rec);
        if let Err(e) = res {
            self.rows.push(
                Row::new(
                    "audit",
                    self.config.cluster.audit_log.display().to_string(),
                    format!(
                        "the reconcile record of {} {} was not written: {e}",
                        row.kind, row.resource
                    ),
                )
                .left("fix the audit log, the action itself is done"),
            );
        }
    }

    /// Applies `undo` when --apply, and fills the row's action; audits what was done.
    fn act(&mut self, mut row: Row, undo: impl FnOnce() -> Result<(), String>) {
        if !self.apply {
            row.action = "would remove".into();
            row.left = true;
            self.rows.push(row);
            return;
        }
        let ok = match undo() {
            Ok(()) => {
                row.action = "removed".into();
                true
            }
            Err(e) => {
                row.action = format!("failed: {e}");
                row.left = true;
                false
            }
        };
        self.audit(&row, ok);
        self.rows.push(row);
    }
}

/// Tears one journal down as the epilog would ([`tenancy_node::spine::teardown`]).
fn teardown_journal(
    layers: &mut [Box<dyn Layer + '_>],
    journals: &JournalDir,
    mut journal: Journal,
) -> Result<(), String> {
    // (reconcile holds the node lock.)
    let failures = tenancy_node::spine::teardown(layers, journals, &mut journal);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// What `journals` claim, as the layers of this build say ([`Layer::claims`]); a job whose
/// step a layer cannot read goes into `unreadable`, and what is named after it is kept.
fn owned_by(
    layers: &[Box<dyn Layer + '_>],
    journals: &[Journal],
    unreadable: &mut BTreeSet<u64>,
) -> BTreeSet<Claim> {
    let mut owned = BTreeSet::new();
    for j in journals {
        for s in &j.steps {
            let Some(layer) = layers.iter().find(|l| l.name() == s.layer) else {
                continue;
            };
            match layer.claims(&s.intent, s.made.as_ref()) {
                Ok(claims) => owned.extend(claims),
                Err(_) => {
                    unreadable.insert(j.job_id);
                }
            }
        }
    }
    owned
}

/// The journals found, sorted by whether Slurm still runs their jobs.
struct Found {
    live: Vec<Journal>,
    dead: Vec<Journal>,
    /// Journals restored from the intent log in a dry run (not written: judged as if they were).
    dry_from_log: Vec<Journal>,
    /// Jobs whose journal (or intent log record) cannot be read.
    unreadable: BTreeSet<u64>,
}

pub fn run(config: &Config, args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    let node = match &args.node {
        Some(n) => n.clone(),
        None => short_hostname()?,
    };
    let journals = JournalDir::open(&config.cluster.state_dir)
        .with_context(|| format!("state_dir {}", config.cluster.state_dir.display()))?;
    // No prolog decides or makes anything while reconcile looks.
    let _lock = journals
        .lock_node()
        .with_context(|| format!("cannot take the node lock in {}", journals.path().display()))?;
    let (user, uid) = operator();
    let mut cx = Ctx {
        config,
        node: node.clone(),
        apply: args.apply,
        user,
        uid,
        tenants: args.tenants.clone(),
        rows: Vec::new(),
    };
    // Slurm is asked after the lock is held: every journal on disk is older than its answer.
    let running = running_jobs(&args, &node);
    let known = known_jobs(&args);
    let found = find_journals(&mut cx, &journals, &args, &running)?;
    if let Err(why) = &running {
        cx.rows.push(
            Row::new(
                "slurm",
                args.squeue.display().to_string(),
                format!("Slurm cannot be asked: {why}"),
            )
            .left(format!(
                "{} journal(s) not checked, none touched",
                found.live.len()
            )),
        );
    }
    let mut node_layers = layers::for_node(config);
    tear_down_dead(&mut cx, &mut node_layers, &journals, found.dead);
    if args.apply {
        rebuild_occupancy(&mut cx, &journals);
    }
    find_orphans(
        &mut cx,
        &mut node_layers,
        &journals,
        found.live,
        found.dry_from_log,
        found.unreadable,
        &known,
    );
    let left = cx.rows.iter().any(|r| r.left);
    Rows {
        headers: &["kind", "job", "tenant", "resource", "finding", "action"],
        rows: &cx.rows,
        cells: |r: &Row| {
            vec![
                r.kind.clone(),
                r.job_id.map(|j| j.to_string()).unwrap_or_default(),
                r.tenant.clone().unwrap_or_default(),
                r.resource.clone(),
                r.finding.clone(),
                r.action.clone(),
            ]
        },
    }
    .print(args.format)?;
    if cx.rows.is_empty() && args.format == Format::Table {
        println!("node {node}: nothing to reconcile");
    }
    if args.apply && !left {
        crate::metrics::mark_reconciled(journals.path());
    }
    Ok(if left {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Restores what the intent log holds and reads every journal, sorted by whether Slurm still
/// runs the job; the unreadable ones are reported.
fn find_journals(
    cx: &mut Ctx,
    journals: &JournalDir,
    args: &ReconcileArgs,
    running: &Result<BTreeSet<u64>, String>,
) -> anyhow::Result<Found> {
    // After a power loss a journal file written since the last sync may be gone or empty; the
    // intent log holds every job's intents on disk (restored with --apply, considered either way).
    let (restored, unreadable_records) = journals
        .recover_intents(args.apply)
        .context("cannot read the intent log")?;
    // Jobs whose journal (or intent log record) cannot be read (corrupt, or of a newer
    // format): what is named after them is kept.
    let mut unreadable = BTreeSet::new();
    for (job, why) in unreadable_records {
        unreadable.insert(job);
        cx.rows.push(
            Row::new(
                "journal",
                journals
                    .path()
                    .join(tenancy_job::intent_log::FILE)
                    .display()
                    .to_string(),
                why,
            )
            .job(job)
            .left("inspect it with the build that wrote it; its resources are treated as owned"),
        );
    }
    let mut from_log = Vec::new();
    for j in restored {
        let mut row = Row::new(
            "journal",
            journals.journal_path(j.job_id).display().to_string(),
            "missing or older than the intents the intent log holds from before a restart",
        )
        .job(j.job_id)
        .tenant(&j.tenant);
        if args.apply {
            row.action = "restored".into();
        } else {
            row.action = "would restore".into();
            row.left = true;
            // Not written in a dry run: judged below as if it were.
            from_log.push(j);
        }
        cx.rows.push(row);
    }
    // (kept to judge orphans, as the dead journals a dry run leaves on disk are)
    let dry_from_log = from_log.clone();
    let mut live = Vec::new();
    let mut dead = Vec::new();
    for j in from_log {
        match running {
            Ok(r) if !r.contains(&j.job_id) => dead.push(j),
            _ => live.push(j),
        }
    }
    for id in journals.job_ids().context("cannot list the journals")? {
        if live.iter().chain(&dead).any(|j| j.job_id == id) {
            continue;
        }
        match journals.load(id) {
            Ok(Some(j)) => match running {
                Ok(r) if !r.contains(&id) => dead.push(j),
                _ => live.push(j),
            },
            Ok(None) => {}
            Err(e) => {
                unreadable.insert(id);
                cx.rows.push(
                    Row::new(
                        "journal",
                        journals.journal_path(id).display().to_string(),
                        format!("unreadable: {e}"),
                    )
                    .job(id)
                    .left("inspect it; its resources are treated as owned"),
                );
            }
        }
    }
    Ok(Found {
        live,
        dead,
        dry_from_log,
        unreadable,
    })
}

/// Tears down the journals of jobs Slurm no longer runs, as their epilogs would.
fn tear_down_dead(
    cx: &mut Ctx,
    node_layers: &mut [Box<dyn Layer + '_>],
    journals: &JournalDir,
    dead: Vec<Journal>,
) {
    for j in dead {
        let row = Row::new(
            "journal",
            journals.journal_path(j.job_id).display().to_string(),
            format!(
                "Slurm no longer runs the job ({} step(s): {}){}",
                j.steps.len(),
                j.steps
                    .iter()
                    .map(|s| s.layer.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                if j.from_earlier_boot() {
                    "; started before the node restarted: only what outlives a restart \
                     (scratch) is undone"
                } else {
                    ""
                }
            ),
        )
        .job(j.job_id)
        .tenant(&j.tenant);
        let layers = &mut *node_layers;
        cx.act(row, move || teardown_journal(layers, journals, j));
    }
}

/// The occupancy index is derived from the journals; an epilog killed mid-teardown (or a
/// crash, the index is not synced) can leave an entry without a journal, which would keep
/// refusing tiers that do not share the node. Rewritten from the journals that remain.
fn rebuild_occupancy(cx: &mut Ctx, journals: &JournalDir) {
    let index = journals.path().join("occupancy").display().to_string();
    match journals.rebuild_occupancy_index() {
        Ok(None) => {}
        Ok(Some((old, new))) => {
            let list = |v: &[u64]| {
                if v.is_empty() {
                    "none".to_string()
                } else {
                    v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
                }
            };
            let was = old.map_or_else(|| "missing or damaged".to_string(), |o| list(&o));
            let mut row = Row::new(
                "occupancy",
                index,
                format!("listed jobs {was}; the journals hold {}", list(&new)),
            );
            row.action = "rebuilt".into();
            cx.rows.push(row);
        }
        Err(e) => cx.rows.push(
            Row::new("occupancy", index, format!("cannot be rebuilt: {e}")).left(
                "kept as it is (its entries still refuse sharing); rerun once every journal reads",
            ),
        ),
    }
}

/// Reports (and with --apply removes) what no remaining journal owns: each layer of this
/// build searches the node for what it makes ([`Layer::orphans`]) and says what the journals
/// claim ([`Layer::claims`]).
#[allow(clippy::too_many_arguments)]
fn find_orphans(
    cx: &mut Ctx,
    node_layers: &mut [Box<dyn Layer + '_>],
    journals: &JournalDir,
    live: Vec<Journal>,
    dry_from_log: Vec<Journal>,
    mut unreadable: BTreeSet<u64>,
    known: &Result<BTreeSet<u64>, String>,
) {
    // Orphans are judged against the journals that remain (live ones and failed teardowns).
    let mut remaining = live;
    for j in dry_from_log {
        if !remaining.iter().any(|r| r.job_id == j.job_id) {
            remaining.push(j);
        }
    }
    for id in journals.job_ids().unwrap_or_default() {
        if let Ok(Some(j)) = journals.load(id) {
            if !remaining.iter().any(|r| r.job_id == id) {
                remaining.push(j);
            }
        }
    }
    // In a dry run the dead journals still exist: their resources are reported with them, not
    // a second time as orphans.
    let owned = owned_by(node_layers, &remaining, &mut unreadable);
    let tenants = cx.tenants.clone();
    let scope = OrphanScope {
        owned: &owned,
        unreadable: &unreadable,
        known,
        tenants: &tenants,
        apply: cx.apply,
    };
    for layer in node_layers.iter_mut() {
        for o in layer.orphans(&scope) {
            let mut row = Row::new(o.kind, o.resource, o.finding);
            row.job_id = o.job;
            row.tenant = o.tenant;
            match o.what {
                OrphanAction::Left(why) => cx.rows.push(row.left(why)),
                OrphanAction::Remove(remove) => cx.act(row, remove),
                OrphanAction::Done {
                    action,
                    ok,
                    left,
                    audit,
                } => {
                    row.action = action;
                    row.left = left;
                    if audit {
                        cx.audit(&row, ok);
                    }
                    cx.rows.push(row);
                }
            }
        }
    }
}
