//! `tenancyctl doctor`: is this node set up so that every layer can isolate every job?
//! Checks the product's own prerequisites, then the device layer's view of cgroups and Slurm.

use crate::output::Format;
use crate::output::Rows;
use serde::Serialize;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tenancy_config::Config;
use tenancy_devices::doctor::{doctor, DoctorParams, Severity};

#[derive(clap::Args)]
pub struct DoctorArgs {
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Slurm's cgroup.conf (default: next to SLURM_CONF, else /etc/slurm/cgroup.conf)
    #[arg(long)]
    pub slurm_cgroup_conf: Option<PathBuf>,
    /// PAM configuration folder searched for pam_slurm_adopt
    #[arg(long, default_value = "/etc/pam.d")]
    pub pam_dir: PathBuf,
    /// Slurm's slurm.conf, read for its Prolog= and Epilog= lines (default: SLURM_CONF, else
    /// /etc/slurm/slurm.conf)
    #[arg(long)]
    pub slurm_conf: Option<PathBuf>,
}

/// The programs of slurm.conf's `key=` lines (`Prolog`, `Epilog`; key case-insensitive, `#`
/// comments dropped, a line may list several, comma-separated).
fn programs(slurm_conf: &str, key: &str) -> Vec<String> {
    slurm_conf
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.trim().eq_ignore_ascii_case(key))
        .flat_map(|(_, v)| v.split(',').map(|p| p.trim().to_string()))
        .filter(|v| !v.is_empty())
        .collect()
}

/// The warning of a slurm.conf check when the file cannot be read.
fn unreadable_slurm_conf(check: &str, slurm_conf: &Path) -> Row {
    row(
        check,
        Severity::Warn,
        format!("cannot read {}", slurm_conf.display()),
        Some("pass --slurm-conf, or set SLURM_CONF".into()),
    )
}

/// Whether slurmctld refuses at submission what the prolog would refuse (`JobSubmitPlugins`
/// lists `tenancy`). Without it a user who leaves the sbatch check out hands the prolog a job it
/// refuses, and Slurm drains the node: a warning, as the node still isolates every job it runs.
fn job_submit_row(slurm_conf: &Path, text: Option<&str>) -> Row {
    const CHECK: &str = "slurm.job_submit";
    let Some(text) = text else {
        return unreadable_slurm_conf(CHECK, slurm_conf);
    };
    let listed = programs(text, "JobSubmitPlugins")
        .iter()
        .any(|p| p == "tenancy" || p == "job_submit/tenancy");
    if listed {
        return row(
            CHECK,
            Severity::Ok,
            "JobSubmitPlugins lists tenancy: slurmctld refuses what the prolog would refuse".into(),
            None,
        );
    }
    row(
        CHECK,
        Severity::Warn,
        format!(
            "{} has no JobSubmitPlugins=tenancy: a user who leaves the sbatch check out (a \
             plugstack of their own) can submit jobs the prolog refuses, and Slurm drains the \
             node for each",
            slurm_conf.display()
        ),
        Some(
            "on the slurmctld host: install -m 0755 target/release/libjob_submit_tenancy.so \
             <PluginDir>/job_submit_tenancy.so, add JobSubmitPlugins=tenancy to slurm.conf, \
             scontrol reconfigure"
                .into(),
        ),
    )
}

/// Whether each job gets its own /tmp and /dev/shm: Slurm's `NamespaceType=namespace/linux`
/// from 25.11 (the recommended one there; `namespace/tmpfs` is the old plugin renamed), or
/// `JobContainerType=job_container/tmpfs` on 22.05 to 25.05 (25.11+ still read it, and warn
/// that it is deprecated). Without it both are the node's, shared by the jobs of every tenant:
/// a file one job leaves there with the usual umask, or a POSIX shared memory segment, is
/// readable by the next tenant's job (a warning: the product's layers still hold, and TMPDIR
/// points at the job's scratch). With it, a scratch root under /tmp or /dev/shm is hidden from
/// the job's own tasks (an error).
fn job_container_row(slurm_conf: &Path, text: Option<&str>, scratch_root: &Path) -> Row {
    const CHECK: &str = "slurm.job_container";
    let Some(text) = text else {
        return unreadable_slurm_conf(CHECK, slurm_conf);
    };
    let namespace = programs(text, "NamespaceType")
        .into_iter()
        .find(|p| p == "namespace/linux" || p == "namespace/tmpfs");
    let tmpfs = namespace.is_some()
        || programs(text, "JobContainerType")
            .iter()
            .any(|p| p == "job_container/tmpfs");
    let how = match &namespace {
        Some(p) => format!("NamespaceType={p}"),
        None => "JobContainerType=job_container/tmpfs".to_string(),
    };
    let hidden = ["/tmp", "/dev/shm"]
        .into_iter()
        .find(|d| scratch_root.starts_with(d));
    match (tmpfs, hidden) {
        (true, None) => row(
            CHECK,
            Severity::Ok,
            format!("{how}: each job has its own /tmp and /dev/shm"),
            None,
        ),
        (true, Some(d)) => row(
            CHECK,
            Severity::Error,
            format!(
                "cluster.scratch_root {} is under {d}, which {how} replaces in every job: no \
                 job would see its scratch folder",
                scratch_root.display()
            ),
            Some("move cluster.scratch_root to a local disk outside /tmp and /dev/shm".into()),
        ),
        (false, _) => row(
            CHECK,
            Severity::Warn,
            format!(
                "{} has neither NamespaceType=namespace/linux nor JobContainerType=\
                 job_container/tmpfs: /tmp and /dev/shm are the \
                 node's, shared by the jobs of every tenant (a file left there with the usual \
                 umask is readable by the next tenant's job)",
                slurm_conf.display()
            ),
            Some(
                "Slurm 25.11 and later: add NamespaceType=namespace/linux and PrologFlags=Contain \
                 to slurm.conf and a namespace.yaml with base_path on a local disk outside /tmp; \
                 Slurm 22.05 to 25.05: JobContainerType=job_container/tmpfs and a \
                 job_container.conf with BasePath= likewise (docs/admin-guide.md); then restart slurmd"
                    .into(),
            ),
        ),
    }
}

/// tenancy-prolog and tenancy-epilog are statically linked and hand the jobs that need a
/// shared library (NVML for a MIG slice; the prolog also NSS modules) to
/// tenancy-prolog-dynamic in their own folder: without it such jobs fail (and drain the node).
/// A Prolog= that names tenancy-prolog-dynamic itself needs nothing beside it.
fn handoff_rows(slurm_conf: &Path) -> Vec<Row> {
    use tenancy_node::run::DYNAMIC_BUILD;
    let text = match std::fs::read_to_string(slurm_conf) {
        Ok(t) => t,
        Err(e) => {
            return ["slurm.prolog", "slurm.epilog"]
                .into_iter()
                .map(|check| {
                    row(
                        check,
                        Severity::Warn,
                        format!("cannot read {}: {e}", slurm_conf.display()),
                        Some("pass --slurm-conf, or set SLURM_CONF".into()),
                    )
                })
                .collect()
        }
    };
    let mut rows = Vec::new();
    for (key, check, ours, without) in [
        (
            "Prolog",
            "slurm.prolog",
            "tenancy-prolog",
            "MIG jobs, and jobs whose user or groups NSS modules (sssd, LDAP) decide, would be \
             refused and drain the node",
        ),
        (
            "Epilog",
            "slurm.epilog",
            "tenancy-epilog",
            "MIG jobs would fail to end and drain the node",
        ),
    ] {
        let named: Vec<PathBuf> = programs(&text, key)
            .into_iter()
            .map(PathBuf::from)
            .collect();
        let is = |p: &PathBuf, n: &str| p.file_name().is_some_and(|f| f == n);
        if key == "Prolog" && named.iter().any(|p| is(p, DYNAMIC_BUILD)) {
            rows.push(row(
                check,
                Severity::Ok,
                format!("Prolog= runs {DYNAMIC_BUILD}, which hands nothing off"),
                None,
            ));
            continue;
        }
        let Some(program) = named.iter().find(|p| is(p, ours)) else {
            // A wrapper script or a glob may still run it: say so, without failing the node.
            rows.push(row(
                check,
                Severity::Warn,
                format!(
                    "{} names no {ours} in {key}=: unless a wrapper runs it, the product does \
                     not {} jobs",
                    slurm_conf.display(),
                    if key == "Prolog" {
                        "isolate"
                    } else {
                        "tear down"
                    }
                ),
                Some(format!("add {key}=/usr/local/sbin/{ours} to slurm.conf")),
            ));
            continue;
        };
        let handoff = program.with_file_name(DYNAMIC_BUILD);
        let runnable = std::fs::metadata(&handoff).is_ok_and(|m| {
            m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
        });
        rows.push(if runnable {
            row(
                check,
                Severity::Ok,
                format!(
                    "{key}={} hands the jobs it cannot run alone to {}",
                    program.display(),
                    handoff.display()
                ),
                None,
            )
        } else {
            row(
                check,
                Severity::Error,
                format!(
                    "{key}={}: {} is missing or not executable, and {ours} (statically linked, \
                     it cannot load shared libraries) hands jobs to it: {without}",
                    program.display(),
                    handoff.display()
                ),
                Some(format!(
                    "install -m 0755 target/release/{DYNAMIC_BUILD} {}",
                    handoff.display()
                )),
            )
        });
    }
    rows
}

/// A PAM service file that enables `pam_slurm_adopt`.
struct AdoptingService {
    /// `file:line` of each pam_slurm_adopt line.
    adopt: Vec<String>,
    /// `file:line` of a `session required|requisite` line with pam_tenancy.so or
    /// `pam_exec.so ... tenancyctl adopt`, which moves adopted sessions into the job's
    /// isolation (or refuses them).
    hook: Option<String>,
    /// `file:line option` of each pam_slurm_adopt option that lets a user in without adopting
    /// the session into a job: such a session runs outside every job's device allowlist.
    lax: Vec<String>,
    /// `file:line` of each session line naming a pam_tenancy.so that is not installed (PAM
    /// then fails every login of the service).
    missing: Vec<String>,
    /// `file:line` of each `tenancyctl adopt` line without `--config`: pam_exec gives adopt only
    /// the PAM environment, so it then reads /etc/slurm/tenancy.toml.
    exec_default_config: Vec<String>,
}

/// Whether the PAM module `name` (a path, or a name Linux-PAM looks up in its module
/// folders) is installed.
fn pam_module_installed(name: &str) -> bool {
    let p = Path::new(name);
    if p.is_absolute() {
        return p.is_file();
    }
    let arch = std::env::consts::ARCH;
    [
        format!("/lib/{arch}-linux-gnu/security"),
        format!("/usr/lib/{arch}-linux-gnu/security"),
        "/lib/security".into(),
        "/lib64/security".into(),
        "/usr/lib64/security".into(),
        "/usr/lib/security".into(),
    ]
    .iter()
    .any(|d| Path::new(d).join(p).is_file())
}

/// The pam_slurm_adopt options of one line under which a user's session can pass without
/// being adopted into a job (pam_slurm_adopt's defaults: action_no_jobs=deny,
/// action_unknown=newest, action_adopt_failure=allow, action_generic_failure=ignore).
fn lax_adopt_options(words: &[&str]) -> Vec<String> {
    let value = |key: &str| {
        words
            .iter()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
    };
    let mut lax = Vec::new();
    if value("action_no_jobs") == Some("ignore") {
        lax.push("action_no_jobs=ignore".to_string());
    }
    if value("action_unknown") == Some("allow") {
        lax.push("action_unknown=allow".to_string());
    }
    for (key, default) in [
        ("action_adopt_failure", "allow"),
        ("action_generic_failure", "ignore"),
    ] {
        match value(key) {
            Some("deny") => {}
            Some(v) => lax.push(format!("{key}={v}")),
            None => lax.push(format!("{key}={default} (the default)")),
        }
    }
    lax
}

/// The PAM services under `dir` that enable `pam_slurm_adopt`: ssh sessions it adopts join the
/// job's extern step, which never passes through the SPANK task hook, so they run outside the
/// job's device allowlist and firewall unless `tenancyctl adopt` moves them.
fn pam_slurm_adopt_services(dir: &Path) -> std::io::Result<Vec<AdoptingService>> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let mut svc = AdoptingService {
            adopt: Vec::new(),
            hook: None,
            lax: Vec::new(),
            missing: Vec::new(),
            exec_default_config: Vec::new(),
        };
        for (n, line) in text.lines().enumerate() {
            let active = line.split('#').next().unwrap_or_default();
            let at = || format!("{}:{}", file.display(), n + 1);
            let words: Vec<&str> = active.split_whitespace().collect();
            if active.contains("pam_slurm_adopt") {
                svc.adopt.push(at());
                for o in lax_adopt_options(&words) {
                    svc.lax.push(format!("{} {o}", at()));
                }
            }
            // An optional hook would let a refused session go on: only required/requisite count.
            let session_required = words.len() >= 3
                && words[0] == "session"
                && matches!(words[1], "required" | "requisite");
            let module = session_required && words[2].ends_with("pam_tenancy.so");
            if module && !pam_module_installed(words[2]) {
                svc.missing.push(format!("{} ({})", at(), words[2]));
                continue;
            }
            // `tenancyctl [--config PATH] adopt [...]`
            let tenancyctl = words.iter().position(|w| w.ends_with("tenancyctl"));
            let exec = session_required
                && words[2].ends_with("pam_exec.so")
                && tenancyctl.is_some_and(|i| words[i + 1..].contains(&"adopt"));
            if exec && !words.iter().any(|w| w.starts_with("--config")) {
                svc.exec_default_config.push(at());
            }
            if module || exec {
                svc.hook = Some(at());
            }
        }
        if !svc.adopt.is_empty() {
            out.push(svc);
        }
    }
    Ok(out)
}

#[derive(Serialize)]
struct Row {
    check: String,
    severity: String,
    message: String,
    remedy: String,
}

/// A tier's extra device classes (`device_classes`) are allowed to every job of the tier on top
/// of its own slice: one on the nvidia-caps major, or a whole NVIDIA major (`c 195:* rw`),
/// opens other jobs' MIG slices or other GPUs. The majors are the driver's, so this is checked
/// on the node, not in the config.
fn extra_device_rows(config: &Config, majors: &tenancy_devices::driver::NvidiaMajors) -> Vec<Row> {
    let mut found = Vec::new();
    for tier in config.tiers.values() {
        for text in &tier.device_classes {
            let Ok(class) = text.parse::<tenancy_devices::DeviceClass>() else {
                continue;
            };
            let char_major = class
                .major
                .filter(|_| class.dev_type == tenancy_devices::DevType::Char);
            let Some(major) = char_major else { continue };
            let Some((name, _)) = majors.all.iter().find(|(_, m)| *m == major) else {
                continue;
            };
            let why = if majors.caps == Some(major) {
                "the MIG capability files: other jobs' slices, and config/monitor"
            } else if class.minor.is_none() {
                "every device of that NVIDIA major"
            } else {
                continue;
            };
            found.push(format!("tier {}: `{text}` ({name}): {why}", tier.name));
        }
    }
    if found.is_empty() {
        return Vec::new();
    }
    vec![row(
        "tier.device_classes",
        Severity::Error,
        format!(
            "extra device classes open NVIDIA devices to every job of their tier: {}",
            found.join("; ")
        ),
        Some(
            "remove them: a job's slice, its GPU, nvidiactl and nvidia-uvm are allowed by the \
             devices layer itself; name single non-MIG devices only"
                .into(),
        ),
    )]
}

const YAMA_PTRACE_SCOPE: &str = "/proc/sys/kernel/yama/ptrace_scope";

/// A user may belong to two tenants and run a job of each on one node, under one uid: without
/// Yama's ptrace restriction, a process of one job can ptrace the other or take its sockets and
/// files (`pidfd_getfd`), and so use the other tenant's device slice, egress and scratch.
/// `scope`: the content of [`YAMA_PTRACE_SCOPE`], None when Yama is not in the kernel.
fn ptrace_row(scope: Option<&str>) -> Row {
    let remedy = Some(
        "`sysctl kernel.yama.ptrace_scope=1` (in /etc/sysctl.d/), or a kernel with Yama \
         (CONFIG_SECURITY_YAMA); or keep users who belong to several tenants off shared nodes"
            .to_string(),
    );
    let why = "a user in two tenants with a job of each on this node can reach one job's \
               processes from the other (ptrace, pidfd_getfd: its sockets, device files and \
               scratch), across the tenants' isolation";
    match scope.map(str::trim) {
        Some(v) if v.parse::<u32>().is_ok_and(|n| n >= 1) => row(
            "node.ptrace_scope",
            Severity::Ok,
            format!("Yama ptrace_scope is {v}: a job's processes cannot attach to another job's"),
            None,
        ),
        Some(v) => row(
            "node.ptrace_scope",
            Severity::Warn,
            format!("Yama ptrace_scope is {v}: {why}"),
            remedy,
        ),
        None => row(
            "node.ptrace_scope",
            Severity::Warn,
            format!("the kernel has no Yama ({YAMA_PTRACE_SCOPE} is missing): {why}"),
            remedy,
        ),
    }
}

/// The key that authenticates anchors: without one, any local user's syslog line can pass
/// for an anchor and make `audit verify --anchor` report a cut or rewritten log; a key set
/// but unreadable leaves this node's anchors without the MAC the verify with the key wants.
fn anchor_key_row(key: Option<&Path>) -> Row {
    let make = "head -c 32 /dev/urandom > /etc/slurm/tenancy-anchor.key && chmod 600 \
                /etc/slurm/tenancy-anchor.key, the same file on every node and with the \
                auditor, and cluster.audit_anchor_key = that path";
    match key.map(tenancy_audit_log::AnchorKey::load) {
        None => row(
            "audit.anchor_key",
            Severity::Warn,
            "cluster.audit_anchor_key is not set: anchors are not authenticated, and any \
             local user can write a line to syslog (logger) that `audit verify --anchor` \
             takes for an anchor and reports as a cut or rewritten log"
                .into(),
            Some(make.into()),
        ),
        Some(Ok(_)) => row(
            "audit.anchor_key",
            Severity::Ok,
            format!(
                "anchors carry the HMAC of {}",
                key.map(Path::display).unwrap()
            ),
            None,
        ),
        Some(Err(e)) => row(
            "audit.anchor_key",
            Severity::Error,
            format!("{e}: this node's anchors go out without their MAC, and a verify with the key leaves them out"),
            Some(make.into()),
        ),
    }
}

/// Which key authenticates this node's anchors: its own Ed25519 key (`[audit] signing_key`),
/// which an auditor checks with its public key alone, or only the cluster's shared HMAC key
/// (logs written before keep verifying with it), or none.
fn signing_row(path: &Path, hmac: Option<&Path>) -> Row {
    let make = "tenancyctl audit keygen (and add the line it prints to the nodes' public keys \
                file, audit.public_keys)";
    match tenancy_audit_log::NodeKey::load(path) {
        Ok(k) => row(
            "audit.signing",
            Severity::Ok,
            format!(
                "anchors are signed with this node's Ed25519 key {} ({}){}",
                k.id(),
                path.display(),
                if hmac.is_some() {
                    " and carry the cluster's HMAC too (for verifiers of older logs)"
                } else {
                    ""
                }
            ),
            None,
        ),
        Err(_) if !path.exists() => row(
            "audit.signing",
            Severity::Warn,
            format!(
                "no signing key at {}: anchors carry {}; root on any node can forge them, and \
                 whoever verifies needs the secret",
                path.display(),
                if hmac.is_some() {
                    "the cluster's shared HMAC alone"
                } else {
                    "no signature and no MAC"
                }
            ),
            Some(make.into()),
        ),
        Err(e) => row(
            "audit.signing",
            Severity::Error,
            format!("{e}: this node's anchors go out unsigned"),
            Some(make.into()),
        ),
    }
}

/// The clock every record's time comes from (adjtimex): anchors say whether it was
/// synchronised, and `audit verify` reports a node whose anchors say it was not.
fn clock_row(c: Option<tenancy_audit_log::ClockSync>) -> Row {
    match c {
        Some(c) if c.synchronised => row(
            "audit.clock",
            Severity::Ok,
            format!(
                "the clock is synchronised (estimated error {} µs)",
                c.esterror_us
            ),
            None,
        ),
        Some(c) => row(
            "audit.clock",
            Severity::Warn,
            format!(
                "the kernel says the clock is not synchronised (adjtimex: TIME_ERROR or \
                 STA_UNSYNC; estimated error {} ms): record times cannot be trusted, and \
                 every anchor says so (PCI DSS 10.6)",
                c.esterror_us / 1000
            ),
            Some("run a time service (chrony, ntpsec, systemd-timesyncd) against the site's time sources".into()),
        ),
        None => row(
            "audit.clock",
            Severity::Warn,
            "adjtimex refused: the clock's state is unknown, and anchors say so".into(),
            None,
        ),
    }
}

/// Whether records leave the node: `[audit] collectors` and the forwarder's cursors.
fn forward_row(config: &Config) -> Row {
    if config.audit.collectors.is_empty() {
        return row(
            "audit.forward",
            Severity::Warn,
            "no [audit] collectors: the records stay on this node, where its root can remove \
             them (PCI DSS 10.3.3 asks for a copy on a separate log server)"
                .into(),
            Some(
                "set [audit] collectors and ca_file, and enable tenancy-audit-forward.service"
                    .into(),
            ),
        );
    }
    let mut notes = Vec::new();
    for c in &config.audit.collectors {
        match crate::forward::read_cursor(&crate::forward::cursor_path(config, c)) {
            Ok(Some(cur)) => notes.push(format!(
                "{c}: confirmed up to seq {}{}",
                cur.record.seq,
                cur.last_error
                    .as_deref()
                    .filter(|_| !cur.connected)
                    .map(|e| format!(", last error: {e}"))
                    .unwrap_or_default()
            )),
            Ok(None) => notes.push(format!("{c}: nothing forwarded yet")),
            Err(e) => notes.push(e),
        }
    }
    row(
        "audit.forward",
        Severity::Ok,
        format!("records are forwarded: {}", notes.join("; ")),
        None,
    )
}

fn row(check: &str, severity: Severity, message: String, remedy: Option<String>) -> Row {
    Row {
        check: check.into(),
        severity: format!("{severity:?}").to_lowercase(),
        message,
        remedy: remedy.unwrap_or_default(),
    }
}

fn root_owned_dir(path: &Path, what: &str, out: &mut Vec<Row>) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0 => out.push(row(
            what,
            Severity::Ok,
            format!(
                "{} is a root-owned folder others cannot write",
                path.display()
            ),
            None,
        )),
        Ok(m) => out.push(row(
            what,
            Severity::Error,
            format!(
                "{} is not a root-owned, non-writable folder (uid {}, mode {:o}, symlink: {})",
                path.display(),
                m.uid(),
                m.mode() & 0o7777,
                m.file_type().is_symlink()
            ),
            Some(format!(
                "chown root:root {0} && chmod go-w {0}",
                path.display()
            )),
        )),
        Err(e) => out.push(row(
            what,
            Severity::Error,
            format!("{}: {e}", path.display()),
            Some(format!("mkdir -p {0} && chmod 755 {0}", path.display())),
        )),
    }
}

/// The intent log: jobs whose intents were recorded before the last restart (a power loss may
/// have taken their journal files) wait for `tenancyctl reconcile --apply`.
fn intent_log_row(state_dir: &Path) -> Row {
    use tenancy_job::intent_log::{boot_id, IntentLog, FILE};
    let path = state_dir.join(FILE);
    let records = match IntentLog::open_existing(state_dir) {
        Ok(None) => {
            return row(
                "state.intent_log",
                Severity::Ok,
                format!(
                    "{}: none yet (the first job's prolog makes it)",
                    path.display()
                ),
                None,
            )
        }
        Ok(Some(log)) => log.records().map(|r| (log.slots(), r)),
        Err(e) => Err(e),
    };
    match records {
        Ok((slots, records)) => {
            let boot = boot_id();
            let earlier: Vec<String> = records
                .iter()
                .filter(|r| boot != Some(r.boot))
                .map(|r| r.job_id.to_string())
                .collect();
            if earlier.is_empty() {
                row(
                    "state.intent_log",
                    Severity::Ok,
                    format!(
                        "{}: {} of {slots} slot(s) held by running jobs",
                        path.display(),
                        records.len()
                    ),
                    None,
                )
            } else {
                row(
                    "state.intent_log",
                    Severity::Warn,
                    format!(
                        "{}: the intents of job(s) {} were recorded before the node restarted \
                         and their resources may be left",
                        path.display(),
                        earlier.join(", ")
                    ),
                    Some("tenancyctl reconcile --apply".into()),
                )
            }
        }
        Err(e) => row(
            "state.intent_log",
            Severity::Error,
            format!("{}: {e}", path.display()),
            Some(format!(
                "check {}; the prolog cannot record intents there",
                path.display()
            )),
        ),
    }
}

pub fn run(config: &Config, args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let mut rows = Vec::new();
    state_rows(config, &mut rows);
    nvml_rows(config, &mut rows);
    firewall_rows(config, &mut rows);
    let ssh_contained = pam_rows(args, &mut rows);
    slurm_rows(config, args, ssh_contained, &mut rows);
    kernel_rows(&mut rows);
    device_rows(config, args, &mut rows);
    let failed = rows.iter().any(|r| r.severity == "error");
    Rows {
        headers: &["check", "severity", "message", "remedy"],
        rows: &rows,
        cells: |r| {
            vec![
                r.check.clone(),
                r.severity.clone(),
                r.message.clone(),
                r.remedy.clone(),
            ]
        },
    }
    .print(args.format)?;
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The product's folders, intent log and audit anchor key.
fn state_rows(config: &Config, rows: &mut Vec<Row>) {
    root_owned_dir(&config.cluster.scratch_root, "scratch.root", rows);
    scratch_encryption_rows(config, rows);
    root_owned_dir(&config.cluster.state_dir, "state.dir", rows);
    rows.push(intent_log_row(&config.cluster.state_dir));
    if let Some(dir) = config.cluster.audit_log.parent() {
        root_owned_dir(dir, "audit.dir", rows);
    }
    let signing = tenancy_audit_log::NodeKey::load(&config.audit.signing_key).is_ok();
    // With the node's own key, the shared HMAC key is only for verifiers of older logs.
    if !(signing && config.cluster.audit_anchor_key.is_none()) {
        rows.push(anchor_key_row(config.cluster.audit_anchor_key.as_deref()));
    }
    rows.push(signing_row(
        &config.audit.signing_key,
        config.cluster.audit_anchor_key.as_deref(),
    ));
    rows.push(clock_row(tenancy_audit_log::clock_sync()));
    rows.push(forward_row(config));
    if let Some(dir) = &config.cluster.dcgm_job_mapping_dir {
        rows.push(dcgm_dir_row(dir));
    }
}

/// DCGM exporter's job mapping folder: one a user can write is refused by the prolog (jobs then
/// run unlabelled), as a user could otherwise make the prolog fail there and drain the node.
fn dcgm_dir_row(dir: &Path) -> Row {
    match tenancy_node::layers::dcgm::folder_problem(dir) {
        None => row(
            "dcgm.mapping_dir",
            Severity::Ok,
            format!(
                "{} is root's alone (or made by the first MIG job's prolog, root, 0755)",
                dir.display()
            ),
            None,
        ),
        Some(problem) => row(
            "dcgm.mapping_dir",
            Severity::Error,
            problem,
            Some(format!(
                "chown root:root {0} && chmod 0755 {0} (or unset cluster.dcgm_job_mapping_dir)",
                dir.display()
            )),
        ),
    }
}

/// Per tier, whether its job folders are encrypted on this node's scratch root (a tier that
/// requires it on a file system without fscrypt fails every job at the prolog); the node key
/// of retained encrypted folders, and erased folders still waiting in the trash.
fn scratch_encryption_rows(config: &Config, rows: &mut Vec<Row>) {
    use tenancy_config::{ScratchEncryption, ScratchOnExit};
    let root = &config.cluster.scratch_root;
    let support = tenancy_scratch::encryption_support(root);
    for (name, tier) in &config.tiers {
        let check = format!("scratch.encryption.{name}");
        rows.push(match (tier.scratch_encryption, &support) {
            (ScratchEncryption::Required, Ok(fs)) => row(
                &check,
                Severity::Ok,
                format!(
                    "tier {name}: each job folder is encrypted with a key of its own ({}) on {fs}",
                    tenancy_scratch::fscrypt::POLICY_NAME
                ),
                None,
            ),
            (ScratchEncryption::Required, Err(why)) => row(
                &check,
                Severity::Error,
                format!(
                    "tier {name} requires scratch_encryption, and every job of it fails at the prolog: {why}"
                ),
                Some(format!(
                    "move cluster.scratch_root to a file system with fscrypt (ext4 made with `mkfs.ext4 -O encrypt`), or set scratch_encryption = \"off\" in [tiers.{name}]"
                )),
            ),
            (ScratchEncryption::Off, Ok(fs)) => row(
                &check,
                Severity::Ok,
                format!(
                    "tier {name}: scratch_encryption off, job folders in clear; {fs} supports it (scratch_encryption = \"required\")"
                ),
                None,
            ),
            (ScratchEncryption::Off, Err(why)) => row(
                &check,
                Severity::Ok,
                format!(
                    "tier {name}: scratch_encryption off, job folders in clear; it could not be turned on here: {why}"
                ),
                None,
            ),
        });
    }
    let retains_encrypted = config.tiers.values().any(|t| {
        t.scratch_encryption == ScratchEncryption::Required
            && t.scratch_on_exit == ScratchOnExit::Retain
    });
    if retains_encrypted {
        let store = tenancy_scratch::KeyStore::new(&config.cluster.state_dir);
        let path = store.node_key_path();
        rows.push(match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => row(
                "scratch.node_key",
                Severity::Ok,
                format!(
                    "{}: none yet (the first retained encrypted job makes it)",
                    path.display()
                ),
                None,
            ),
            Ok(m) if m.is_file() && m.uid() == 0 && m.mode() & 0o077 == 0 && m.len() == 32 => {
                row(
                    "scratch.node_key",
                    Severity::Ok,
                    format!(
                        "{}: root's alone; it unseals the keys of retained encrypted folders (back it up with the state folder's care: without it they cannot be unlocked)",
                        path.display()
                    ),
                    None,
                )
            }
            Ok(m) => row(
                "scratch.node_key",
                Severity::Error,
                format!(
                    "{} is not a 32-byte file of root's alone (uid {}, mode {:04o}, {} bytes)",
                    path.display(),
                    m.uid(),
                    m.mode() & 0o7777,
                    m.len()
                ),
                Some(format!("chown root {0} && chmod 400 {0}", path.display())),
            ),
            Err(e) => row(
                "scratch.node_key",
                Severity::Error,
                format!("{}: {e}", path.display()),
                None,
            ),
        });
    }
    match tenancy_scratch::trash::list(root) {
        Ok(entries) if entries.is_empty() => {}
        // (A missing scratch root is scratch.root's row.)
        Err(_) if !root.is_dir() => {}
        Ok(entries) => rows.push(row(
            "scratch.trash",
            Severity::Ok,
            format!(
                "{} erased job folder(s) (keys removed) wait for deletion in {}",
                entries.len(),
                root.join(tenancy_scratch::trash::TRASH_DIR).display()
            ),
            Some("tenancyctl reconcile --apply deletes them now".into()),
        )),
        Err(e) => rows.push(row("scratch.trash", Severity::Error, format!("{e}"), None)),
    }
}

/// NVML and each GPU's MIG mode, and the configured profile names against the driver's.
fn nvml_rows(config: &Config, rows: &mut Vec<Row>) {
    if let Some(f) = &config.cluster.nvml_shim_fixture {
        // Only the NVML stand-in reads it (tests and demos).
        std::env::set_var("NVML_SHIM_FIXTURE", f);
    }
    let opened = tenancy_mig::Mig::open(config.cluster.nvml_library.as_deref());
    if opened.is_ok() && !crate::check::configured_mig_names(config).is_empty() {
        match crate::check::mig_name_report(config) {
            Ok((driver, bad)) if bad.is_empty() => rows.push(row(
                "nvml.profiles",
                Severity::Ok,
                format!("the configured MIG profile names are the driver {driver}'s"),
                None,
            )),
            Ok((_, bad)) => {
                for m in bad {
                    rows.push(row(
                        "nvml.profiles",
                        Severity::Warn,
                        m,
                        Some(
                            "keep the product's names in tenancy.toml (the slices are made by \
                             profile id); in gres.conf use `tenancyctl mig slurm-lines`, not \
                             AutoDetect=nvml"
                                .into(),
                        ),
                    ));
                }
            }
            Err(e) => rows.push(row("nvml.profiles", Severity::Warn, e, None)),
        }
    }
    match opened {
        Ok(mig) => match mig.gpus() {
            Ok(gpus) => {
                for g in gpus {
                    let (sev, remedy) = if let Some(why) = &g.unusable {
                        rows.push(row("nvml.gpu", Severity::Warn, why.clone(), None));
                        continue;
                    } else if g.mig_enabled && g.model.is_some() {
                        (Severity::Ok, None)
                    } else {
                        (
                            Severity::Warn,
                            Some(
                                "enable MIG (nvidia-smi -i N -mig 1) on GPUs meant for slices"
                                    .into(),
                            ),
                        )
                    };
                    rows.push(row(
                        "nvml.gpu",
                        sev,
                        format!(
                            "GPU {} {} {}: MIG {}",
                            g.index,
                            g.name,
                            g.uuid,
                            if g.mig_enabled { "on" } else { "off" }
                        ),
                        remedy,
                    ));
                }
            }
            Err(e) => rows.push(row("nvml.gpu", Severity::Error, e.to_string(), None)),
        },
        Err(e) => rows.push(row(
            "nvml.load",
            Severity::Warn,
            format!("{e} (jobs asking for --mig will be refused)"),
            Some("set cluster.nvml_library or install the NVIDIA driver".into()),
        )),
    }
}

/// The firewall table every job's traffic is matched in.
fn firewall_rows(config: &Config, rows: &mut Vec<Row>) {
    match tenancy_node::layers::network::firewall_spec(config) {
        Ok(spec) => {
            let loaded = std::process::Command::new("/usr/sbin/nft")
                .args(["list", "table", "inet", &spec.table_name])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            rows.push(if loaded {
                row(
                    "firewall.table",
                    Severity::Ok,
                    format!("nft table inet {} is loaded", spec.table_name),
                    None,
                )
            } else {
                row(
                    "firewall.table",
                    Severity::Error,
                    format!(
                        "nft table inet {} is not loaded: every job would be refused",
                        spec.table_name
                    ),
                    Some("tenancyctl firewall apply".into()),
                )
            });
        }
        Err(e) => rows.push(row("firewall.table", Severity::Error, e.0, None)),
    }
    if let Ok(spec) = tenancy_node::layers::network::firewall_spec(config) {
        if spec.cross_node.is_some() {
            rows.push(cross_node_row(&spec));
        }
    }
}

/// ssh sessions pam_slurm_adopt adopts into jobs; whether every such session joins its job's
/// isolation (`None`: none is adopted).
fn pam_rows(args: &DoctorArgs, rows: &mut Vec<Row>) -> Option<bool> {
    let pam = pam_slurm_adopt_services(&args.pam_dir);
    if let Ok(svcs) = &pam {
        rows.extend(pam_fallback_row(svcs));
        rows.extend(pam_config_row(svcs));
    }
    let ssh_contained = match &pam {
        Ok(svcs) if !svcs.is_empty() => Some(svcs.iter().all(|s| s.hook.is_some())),
        _ => None,
    };
    rows.push(pam_adopt_row(args, pam));
    ssh_contained
}

/// pam_slurm_adopt letting users in that it did not adopt.
fn pam_fallback_row(svcs: &[AdoptingService]) -> Option<Row> {
    let lax: Vec<String> = svcs.iter().flat_map(|s| s.lax.iter().cloned()).collect();
    if !lax.is_empty() {
        return Some(row(
            "slurm.pam_adopt_fallback",
            Severity::Warn,
            format!(
                "pam_slurm_adopt lets users in without adopting them into a job ({}): \
                 such sessions run outside every job's device allowlist and firewall",
                lax.join(", ")
            ),
            Some(
                "give pam_slurm_adopt action_no_jobs=deny action_adopt_failure=deny \
                 action_generic_failure=deny, and let administrators in with pam_access"
                    .into(),
            ),
        ));
    }
    None
}

/// `tenancyctl adopt` run by pam_exec without a config it can find.
fn pam_config_row(svcs: &[AdoptingService]) -> Option<Row> {
    let lines: Vec<String> = svcs
        .iter()
        .flat_map(|s| s.exec_default_config.iter().cloned())
        .collect();
    if !lines.is_empty() && !Path::new(tenancy_config::DEFAULT_PATH).is_file() {
        return Some(row(
            "slurm.pam_adopt_config",
            Severity::Warn,
            format!(
                "pam_exec runs tenancyctl adopt without --config ({}) and {} does not \
                 exist: pam_exec passes adopt only the PAM environment, where TENANCY_CONFIG \
                 and SLURM_CONF are not set by sshd, so adopt finds no config and refuses \
                 every session pam_slurm_adopt adopts",
                lines.join(", "),
                tenancy_config::DEFAULT_PATH
            ),
            Some("put --config PATH on that line: `tenancyctl --config PATH adopt`".into()),
        ));
    }
    None
}

/// Whether the sessions pam_slurm_adopt adopts join the job's isolation.
fn pam_adopt_row(args: &DoctorArgs, pam: std::io::Result<Vec<AdoptingService>>) -> Row {
    match pam {
        Ok(svcs) if svcs.is_empty() => row(
            "slurm.pam_adopt",
            Severity::Ok,
            format!(
                "pam_slurm_adopt is not enabled in {}",
                args.pam_dir.display()
            ),
            None,
        ),
        Ok(svcs) => {
            let (hooked, bare): (Vec<_>, Vec<_>) = svcs.iter().partition(|s| s.hook.is_some());
            let lines = |v: &[&AdoptingService]| {
                v.iter()
                    .flat_map(|s| s.adopt.iter().cloned())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if bare.is_empty() {
                row(
                    "slurm.pam_adopt",
                    Severity::Ok,
                    format!(
                        "pam_slurm_adopt is enabled ({}) and the sessions it adopts join the job's \
                         isolation through pam_tenancy.so or tenancyctl adopt ({})",
                        lines(&hooked),
                        hooked
                            .iter()
                            .filter_map(|s| s.hook.clone())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None,
                )
            } else {
                let missing: Vec<String> = bare
                    .iter()
                    .flat_map(|s| s.missing.iter().cloned())
                    .collect();
                if !missing.is_empty() {
                    row(
                        "slurm.pam_adopt",
                        Severity::Error,
                        format!(
                            "pam_slurm_adopt is enabled ({}) and the session phase names \
                             pam_tenancy.so, which is not installed ({}): PAM fails every login \
                             of that service",
                            lines(&bare),
                            missing.join(", ")
                        ),
                        Some(format!(
                            "install -m 0644 target/release/libpam_tenancy.so \
                             /lib/{}-linux-gnu/security/pam_tenancy.so",
                            std::env::consts::ARCH
                        )),
                    )
                } else {
                    row(
                        "slurm.pam_adopt",
                        Severity::Error,
                        format!(
                            "pam_slurm_adopt is enabled ({}) without pam_tenancy.so or \
                             tenancyctl adopt: ssh sessions it adopts into a job skip the SPANK \
                             task hook and run without the job's device allowlist and firewall",
                            lines(&bare)
                        ),
                        Some(
                            "add `session required pam_tenancy.so` (or `session required \
                             pam_exec.so /usr/local/bin/tenancyctl --config PATH adopt`) to that PAM service, \
                             after pam_slurm_adopt, or remove pam_slurm_adopt"
                                .into(),
                        ),
                    )
                }
            }
        }
        Err(e) => row(
            "slurm.pam_adopt",
            Severity::Warn,
            format!("cannot read {}: {e}", args.pam_dir.display()),
            None,
        ),
    }
}

/// slurm.conf: the prolog handoff, job_submit, job_container and the containment of jobs'
/// processes.
fn slurm_rows(
    config: &Config,
    args: &DoctorArgs,
    ssh_contained: Option<bool>,
    rows: &mut Vec<Row>,
) {
    let slurm_conf = args.slurm_conf.clone().unwrap_or_else(|| {
        std::env::var_os("SLURM_CONF")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/etc/slurm/slurm.conf"))
    });
    rows.extend(handoff_rows(&slurm_conf));
    rows.push(job_submit_row(
        &slurm_conf,
        std::fs::read_to_string(&slurm_conf).ok().as_deref(),
    ));
    rows.push(job_container_row(
        &slurm_conf,
        std::fs::read_to_string(&slurm_conf).ok().as_deref(),
        &config.cluster.scratch_root,
    ));
    let layout = tenancy_cgroup::layout::CgroupLayout::detect()
        .unwrap_or_else(|_| tenancy_cgroup::layout::CgroupLayout::parse(""));
    for (check, severity, message, remedy) in crate::containment::findings(
        config,
        &slurm_conf,
        std::fs::read_to_string(&slurm_conf).ok().as_deref(),
        &layout,
        ssh_contained,
    ) {
        rows.push(row(check, severity, message, remedy));
    }
    for (check, severity, message, remedy) in crate::scheduler::findings(config, &slurm_conf) {
        rows.push(row(check, severity, message, remedy));
    }
}

/// Kernel settings the isolation relies on.
fn kernel_rows(rows: &mut Vec<Row>) {
    rows.push(ptrace_row(
        std::fs::read_to_string(YAMA_PTRACE_SCOPE).ok().as_deref(),
    ));
}

/// Device classes, RDMA devices and the device controller.
fn device_rows(config: &Config, args: &DoctorArgs, rows: &mut Vec<Row>) {
    if let Ok(majors) = std::fs::read_to_string(&config.node.proc_devices)
        .map_err(|e| e.to_string())
        .and_then(|t| {
            tenancy_devices::driver::NvidiaMajors::parse(&t, &config.node.proc_devices)
                .map_err(|e| e.to_string())
        })
    {
        rows.extend(extra_device_rows(config, &majors));
    }
    let tiers: Vec<(String, Vec<String>)> = config
        .tiers
        .values()
        .map(|t| (t.name.clone(), t.device_classes.clone()))
        .collect();
    for f in tenancy_devices::doctor::rdma_findings(&config.node.rdma_devices, &tiers) {
        rows.push(row(&f.check, f.severity, f.message, f.remedy));
    }
    let cgroup_conf = args.slurm_cgroup_conf.clone().unwrap_or_else(|| {
        std::env::var_os("SLURM_CONF")
            .map(PathBuf::from)
            .and_then(|p| p.parent().map(|d| d.join("cgroup.conf")))
            .unwrap_or_else(|| PathBuf::from("/etc/slurm/cgroup.conf"))
    });
    for f in doctor(&DoctorParams {
        mountinfo: PathBuf::from("/proc/self/mountinfo"),
        slurm_cgroup_conf: cgroup_conf,
        driver: tenancy_devices::DriverPaths {
            proc_devices: config.node.proc_devices.clone(),
            mig_minors: config.node.mig_minors.clone(),
            rdma_devices: config.node.rdma_devices.clone(),
            nvidia_caps: config.node.nvidia_caps_dir.clone(),
        },
        probe_bpf: true,
    }) {
        rows.push(row(&f.check, f.severity, f.message, f.remedy));
    }
}

#[cfg(test)]
mod tests {
    use super::{anchor_key_row, job_container_row, job_submit_row, ptrace_row};

    #[test]
    fn anchors_without_a_usable_key_are_warned_or_failed() {
        use std::os::unix::fs::PermissionsExt;
        let none = anchor_key_row(None);
        assert_eq!(none.severity, "warn");
        assert!(none.message.contains("logger"), "{}", none.message);
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("anchor.key");
        std::fs::write(&key, [3u8; 32]).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(anchor_key_row(Some(&key)).severity, "ok");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let open = anchor_key_row(Some(&key));
        assert_eq!(open.severity, "error");
        assert!(open.message.contains("chmod 600"), "{}", open.message);
        let missing = anchor_key_row(Some(&dir.path().join("none")));
        assert_eq!(missing.severity, "error");
    }

    #[test]
    fn a_cluster_without_the_job_submit_check_is_warned_about() {
        let p = std::path::Path::new("/etc/slurm/slurm.conf");
        for listed in [
            "JobSubmitPlugins=tenancy\n",
            "jobsubmitplugins = lua, job_submit/tenancy # both\n",
        ] {
            assert_eq!(job_submit_row(p, Some(listed)).severity, "ok", "{listed}");
        }
        for missing in [
            "ClusterName=t\n",
            "JobSubmitPlugins=lua\n",
            "#JobSubmitPlugins=tenancy\n",
        ] {
            let r = job_submit_row(p, Some(missing));
            assert_eq!(r.severity, "warn", "{missing}");
            assert!(r.message.contains("drains"), "{}", r.message);
        }
        assert_eq!(job_submit_row(p, None).severity, "warn");
    }

    #[test]
    fn a_node_whose_jobs_share_tmp_and_dev_shm_is_warned_about() {
        let p = std::path::Path::new("/etc/slurm/slurm.conf");
        let scratch = std::path::Path::new("/scratch");
        let on = "JobContainerType=job_container/tmpfs # own /tmp, /dev/shm\n";
        assert_eq!(job_container_row(p, Some(on), scratch).severity, "ok");
        for off in [
            "ClusterName=t\n",
            "JobContainerType=job_container/none\n",
            "#JobContainerType=job_container/tmpfs\n",
        ] {
            let r = job_container_row(p, Some(off), scratch);
            assert_eq!(r.severity, "warn", "{off}");
            assert!(r.message.contains("/dev/shm"), "{}", r.message);
        }
        assert_eq!(job_container_row(p, None, scratch).severity, "warn");
        // A scratch root the per-job /tmp hides from the jobs.
        for hidden in ["/tmp/scratch", "/dev/shm/scratch"] {
            let r = job_container_row(p, Some(on), std::path::Path::new(hidden));
            assert_eq!(r.severity, "error", "{hidden}");
            assert!(r.message.contains(hidden), "{}", r.message);
        }
        // Slurm 25.11+'s namespace plugins give the same.
        for on in [
            "NamespaceType=namespace/linux\n",
            "NamespaceType=namespace/tmpfs\n",
        ] {
            let r = job_container_row(p, Some(on), scratch);
            assert_eq!(r.severity, "ok", "{on}");
            assert!(r.message.starts_with(on.trim()), "{}", r.message);
            let r = job_container_row(p, Some(on), std::path::Path::new("/tmp/scratch"));
            assert_eq!(r.severity, "error", "{on}");
        }
        let r = job_container_row(p, Some("NamespaceType=namespace/none\n"), scratch);
        assert_eq!(r.severity, "warn");
        assert!(r.remedy.contains("namespace/linux"), "{}", r.remedy);
        // Without per-job /tmp, a scratch root there is not this row's concern.
        let r = job_container_row(p, Some("ClusterName=t\n"), std::path::Path::new("/tmp/s"));
        assert_eq!(r.severity, "warn");
    }

    #[test]
    fn a_node_without_yama_ptrace_restriction_is_warned_about() {
        assert_eq!(ptrace_row(Some("1\n")).severity, "ok");
        assert_eq!(ptrace_row(Some("3")).severity, "ok");
        let zero = ptrace_row(Some("0\n"));
        assert_eq!(zero.severity, "warn");
        assert!(zero.message.contains("pidfd_getfd"), "{}", zero.message);
        let none = ptrace_row(None);
        assert_eq!(none.severity, "warn");
        assert!(none.message.contains("no Yama"), "{}", none.message);
    }
}

#[cfg(test)]
mod device_class_tests {
    use super::extra_device_rows;
    use tenancy_test_support::TenancyToml;

    /// A tier's extra class on the nvidia-caps major, or a whole NVIDIA major, is an error on
    /// a node whose driver registers those majors; a single nvidia device or another major is
    /// not.
    #[test]
    fn extra_classes_that_open_nvidia_devices_to_a_tier_are_errors() {
        let parse = |classes: &[&str]| {
            let mut text = TenancyToml::under("t", std::path::Path::new("/"));
            text.tier("wide").device_classes(classes);
            text.tenant("acme").tier("wide").groups(["root"]);
            tenancy_config::Config::parse(&text.to_string(), std::path::Path::new("/t.toml"))
                .unwrap()
        };
        let all = ["c 235:* rw", "c 195:* r", "c 195:254 r", "c 1:3 rw"];
        let config = parse(&all);
        let devices = "Character devices:\n  1 mem\n195 nvidia-frontend\n235 nvidia-caps\n";
        let majors = tenancy_devices::driver::NvidiaMajors::parse(
            devices,
            std::path::Path::new("/proc/devices"),
        )
        .unwrap();
        let rows = extra_device_rows(&config, &majors);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].severity, "error");
        let m = &rows[0].message;
        assert!(m.contains("`c 235:* rw` (nvidia-caps)"), "{m}");
        assert!(m.contains("`c 195:* r` (nvidia-frontend)"), "{m}");
        assert!(!m.contains("195:254") && !m.contains("c 1:3"), "{m}");
        // Without the two classes on NVIDIA majors.
        assert!(extra_device_rows(&parse(&all[2..]), &majors).is_empty());
    }
}

/// With `[network] node_network`: this node has one address there and every tenant's address
/// on that interface (ARCHITECTURE.md, "Across nodes").
fn cross_node_row(spec: &tenancy_network::FirewallSpec) -> Row {
    let fix = Some("tenancyctl firewall apply".to_string());
    let spec = match spec.for_this_node() {
        Ok(s) => s,
        Err(e) => return row("firewall.cross_node", Severity::Error, e.to_string(), None),
    };
    let Some(c) = &spec.cross_node else {
        return row("firewall.cross_node", Severity::Ok, "off".into(), None);
    };
    let node = c
        .node
        .as_ref()
        .map(|n| format!("{} on {}", n.address, n.interface));
    match c.missing_addresses() {
        Ok(m) if m.is_empty() => row(
            "firewall.cross_node",
            Severity::Ok,
            format!(
                "node {}: every tenant's address is on it",
                node.unwrap_or_default()
            ),
            None,
        ),
        Ok(m) => row(
            "firewall.cross_node",
            Severity::Error,
            format!(
                "node {}: tenant addresses missing: {} (their jobs' traffic to other nodes \
                 would have no way back)",
                node.unwrap_or_default(),
                m.join(" ")
            ),
            fix,
        ),
        Err(e) => row("firewall.cross_node", Severity::Error, e.to_string(), fix),
    }
}
