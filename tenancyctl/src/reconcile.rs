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

use anyhow::Context;
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::SystemTime;
use tenancy_audit::{Event, Outcome, Record, Resource, ResourceAction};
use tenancy_config::{Config, Identity};
use tenancy_node::{layers, Claim, Journal, JournalDir, Layer};
use tenancy_output::Format;

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

fn short_hostname() -> anyhow::Result<String> {
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
    fn wanted(&self, tenant: &str) -> bool {
        self.tenants.is_empty() || self.tenants.iter().any(|t| t == tenant)
    }

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
        let res = tenancy_node::spine::append_anchored(self.config, &mut rec);
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

/// What the live journals hold, to tell owned resources from orphans.
#[derive(Default)]
struct Owned {
    /// (gpu uuid, gi id) of made slices.
    gis: BTreeSet<(String, u32)>,
    /// (gpu uuid, placement start) of intended, not yet made, slices.
    placements: BTreeSet<(String, u32)>,
    cgroups: BTreeSet<PathBuf>,
    /// (tenant, job id) of scratch folders.
    scratch: BTreeSet<(String, u64)>,
    /// Jobs whose journal cannot be read: what is named after them may be theirs, and Slurm may
    /// still run them.
    unreadable: BTreeSet<u64>,
}

/// What is done with a resource named after a job whose journal cannot be read.
const KEPT_UNREADABLE: &str = "kept: Slurm may still run the job; inspect its journal";

/// What `journals` own, as the layers of this build claim it.
fn owned_by(layers: &[Box<dyn Layer + '_>], journals: &[Journal]) -> Owned {
    let mut o = Owned::default();
    for j in journals {
        for s in &j.steps {
            let Some(layer) = layers.iter().find(|l| l.name() == s.layer) else {
                continue;
            };
            for claim in layer.claims(&s.intent, s.made.as_ref()) {
                match claim {
                    Claim::GpuInstance { gpu_uuid, gi_id } => {
                        o.gis.insert((gpu_uuid, gi_id));
                    }
                    Claim::Placement { gpu_uuid, start } => {
                        o.placements.insert((gpu_uuid, start));
                    }
                    Claim::Cgroup(dir) => {
                        o.cgroups.insert(dir);
                    }
                }
            }
        }
        // Scratch folders are named by tenant and job: the journal's own say so.
        if j.steps.iter().any(|s| s.layer == "scratch") {
            o.scratch.insert((j.tenant.clone(), j.job_id));
        }
    }
    o
}

fn mig_orphans(cx: &mut Ctx, owned: &Owned) {
    if cx.config.cluster.nvml_library.is_none() && !Path::new("/dev/nvidiactl").exists() {
        // A node without the NVIDIA driver holds no MIG instance.
        return;
    }
    if !owned.unreadable.is_empty() {
        // A GPU instance names no job: without the journal, none can be told from its slices.
        let jobs: Vec<String> = owned.unreadable.iter().map(u64::to_string).collect();
        cx.rows.push(
            Row::new(
                "mig",
                "MIG instances",
                format!(
                    "the journal of job(s) {} is unreadable: which GPU instances they hold is \
                     unknown",
                    jobs.join(", ")
                ),
            )
            .left("MIG instances not checked"),
        );
        return;
    }
    if let Some(fixture) = &cx.config.cluster.nvml_shim_fixture {
        std::env::set_var("NVML_SHIM_FIXTURE", fixture);
    }
    let mig = match tenancy_mig::Mig::open(cx.config.cluster.nvml_library.as_deref()) {
        Ok(m) => m,
        Err(e) => {
            let row = Row::new("nvml", "NVML", format!("cannot open NVML: {e}"))
                .left("MIG instances not checked");
            cx.rows.push(row);
            return;
        }
    };
    let gpus = match mig.instances() {
        Ok(g) => g,
        Err(e) => {
            let row = Row::new("nvml", "NVML", format!("cannot list MIG instances: {e}"))
                .left("MIG instances not checked");
            cx.rows.push(row);
            return;
        }
    };
    for g in gpus {
        for gi in &g.instances {
            let key = (g.uuid.clone(), gi.gi_id);
            if owned.gis.contains(&key) || owned.placements.contains(&(g.uuid.clone(), gi.start)) {
                continue;
            }
            let row = Row::new(
                "mig",
                format!(
                    "{} gi {} (placement {}:{})",
                    g.uuid, gi.gi_id, gi.start, gi.size
                ),
                "GPU instance no journal references",
            );
            let (index, gi_id) = (g.index, gi.gi_id);
            let mig = &mig;
            cx.act(row, || {
                mig.destroy_gi(index, gi_id)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            });
        }
    }
}

fn job_id_of(name: &str) -> Option<u64> {
    name.strip_prefix("job_")?.parse().ok()
}

fn subdirs(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<(String, PathBuf)> = rd
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect();
    v.sort();
    v
}

fn cgroup_orphans(cx: &mut Ctx, owned: &Owned) {
    let layout = match tenancy_devices::CgroupLayout::detect() {
        Ok(l) => l,
        Err(e) => {
            cx.rows.push(
                Row::new(
                    "cgroup",
                    "/proc/self/mountinfo",
                    format!("cannot detect cgroups: {e}"),
                )
                .left("cgroups not checked"),
            );
            return;
        }
    };
    let roots = [
        (layout.v2_root.clone(), tenancy_devices::Backend::V2),
        (layout.v1_devices.clone(), tenancy_devices::Backend::V1),
    ];
    for (root, backend) in roots {
        let Some(root) = root else { continue };
        let product = root.join(tenancy_devices::job::PRODUCT_DIR);
        for (tenant, tdir) in subdirs(&product) {
            if !cx.wanted(&tenant) {
                continue;
            }
            for (name, dir) in subdirs(&tdir) {
                let Some(job) = job_id_of(&name) else {
                    continue;
                };
                if owned.cgroups.contains(&dir) {
                    continue;
                }
                if owned.unreadable.contains(&job) {
                    cx.rows.push(
                        Row::new(
                            "cgroup",
                            dir.display().to_string(),
                            "product cgroup of a job whose journal is unreadable",
                        )
                        .job(job)
                        .tenant(&tenant)
                        .left(KEPT_UNREADABLE),
                    );
                    continue;
                }
                let row = Row::new(
                    "cgroup",
                    dir.display().to_string(),
                    "product cgroup no journal owns",
                )
                .job(job)
                .tenant(&tenant);
                let record = tenancy_devices::DevicesRecord {
                    job_id: job,
                    backend,
                    cgroup_dir: dir.clone(),
                    owned: true,
                    policy: tenancy_devices::DevicePolicy {
                        allow: Vec::new(),
                        deny_majors: Vec::new(),
                        deny_devices: Vec::new(),
                    },
                    v1: None,
                    v2: None,
                };
                cx.act(row, || {
                    tenancy_devices::teardown(&record)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                });
            }
        }
    }
}

/// `known`: the jobs Slurm still has anywhere in the cluster ([`known_jobs`]).
fn scratch_orphans(cx: &mut Ctx, owned: &Owned, known: &Result<BTreeSet<u64>, String>) {
    let root = cx.config.cluster.scratch_root.clone();
    if !root.is_dir() {
        return;
    }
    let known = match known {
        Ok(k) => Some(k),
        Err(why) => {
            cx.rows.push(
                Row::new(
                    "scratch",
                    root.display().to_string(),
                    format!("Slurm cannot be asked which jobs it still has: {why}"),
                )
                .left(
                    "job folders not checked (on a scratch_root the nodes share, they may be \
                     jobs running on other nodes)",
                ),
            );
            None
        }
    };
    for (tenant, tdir) in subdirs(&root).into_iter().filter(|_| known.is_some()) {
        if !cx.wanted(&tenant) || tenancy_scratch::validate_tenant_name(&tenant).is_err() {
            continue;
        }
        let gid = match std::fs::symlink_metadata(&tdir) {
            Ok(m) => std::os::unix::fs::MetadataExt::gid(&m),
            Err(_) => continue,
        };
        for (name, dir) in subdirs(&tdir) {
            let Some(job) = job_id_of(&name) else {
                continue;
            };
            // Owned here, or a job Slurm still has, here or on another node sharing the
            // scratch_root.
            if owned.scratch.contains(&(tenant.clone(), job))
                || known.is_some_and(|k| k.contains(&job))
            {
                continue;
            }
            if owned.unreadable.contains(&job) {
                cx.rows.push(
                    Row::new(
                        "scratch",
                        dir.display().to_string(),
                        "job folder of a job whose journal is unreadable",
                    )
                    .job(job)
                    .tenant(&tenant)
                    .left(KEPT_UNREADABLE),
                );
                continue;
            }
            let row = Row::new(
                "scratch",
                dir.display().to_string(),
                "job folder no journal owns",
            )
            .job(job)
            .tenant(&tenant);
            let spec = tenancy_scratch::ScratchSpec {
                root: root.clone(),
                tenant: tenant.clone(),
                tenant_gid: gid,
                job_id: job,
                uid: 65534,
                gid: 65534,
                mode: tenancy_scratch::DEFAULT_JOB_MODE,
                quota: None,
                tenant_groups: Vec::new(),
            };
            cx.act(row, || {
                tenancy_scratch::wipe(&spec)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            });
        }
    }
    // Retained folders: the longest retention of any tier, so no tenant loses data early.
    let days = cx
        .config
        .tiers
        .values()
        .map(|t| u64::from(t.retain_days))
        .max()
        .unwrap_or(0);
    match tenancy_scratch::purge_retained(&root, days, SystemTime::now(), !cx.apply) {
        Err(e) => cx.rows.push(
            Row::new(
                "retained",
                root.display().to_string(),
                format!("cannot purge: {e}"),
            )
            .left("retained folders not checked"),
        ),
        Ok(actions) => {
            let past = |path: &Path, tenant: &str, job_id: u64, age_days: u64| {
                Row::new(
                    "retained",
                    path.display().to_string(),
                    format!("retained {age_days} day(s), past {days}"),
                )
                .job(job_id)
                .tenant(tenant)
            };
            for a in actions {
                match a {
                    tenancy_scratch::Action::Remove {
                        path,
                        tenant,
                        job_id,
                        age_days,
                        dry_run,
                        ..
                    } => {
                        let mut row = past(&path, &tenant, job_id, age_days);
                        if dry_run {
                            row.action = "would remove".into();
                            row.left = true;
                        } else {
                            row.action = "removed".into();
                            cx.audit(&row, true);
                        }
                        cx.rows.push(row);
                    }
                    tenancy_scratch::Action::Skip { path, reason } => {
                        cx.rows.push(
                            Row::new("retained", path.display().to_string(), reason)
                                .left("not ours or unsafe"),
                        );
                    }
                    tenancy_scratch::Action::Failed {
                        path,
                        tenant,
                        job_id,
                        age_days,
                        error,
                        ..
                    } => {
                        let mut row = past(&path, &tenant, job_id, age_days);
                        row.action = format!("failed: {error}");
                        row.left = true;
                        cx.audit(&row, false);
                        cx.rows.push(row);
                    }
                }
            }
        }
    }
}

/// Runs reconcile on this node with `config`.
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
        &node_layers,
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
                    .join(tenancy_node::intent_log::FILE)
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

/// Reports (and with --apply removes) what no remaining journal owns, as each layer of this
/// build claims it ([`Layer::claims`]).
#[allow(clippy::too_many_arguments)]
fn find_orphans(
    cx: &mut Ctx,
    node_layers: &[Box<dyn Layer + '_>],
    journals: &JournalDir,
    live: Vec<Journal>,
    dry_from_log: Vec<Journal>,
    unreadable: BTreeSet<u64>,
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
    let owned = Owned {
        unreadable,
        ..owned_by(node_layers, &remaining)
    };
    mig_orphans(cx, &owned);
    cgroup_orphans(cx, &owned);
    scratch_orphans(cx, &owned, known);
}
