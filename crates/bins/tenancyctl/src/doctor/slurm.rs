//! slurm.conf: the prolog and epilog handoff, job_submit, the job container and what the
//! containment and scheduler checks find.

use super::{row, DoctorArgs, Row};
use std::path::{Path, PathBuf};
use tenancy_config::Config;
use tenancy_devices::doctor::Severity;

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
        rows.push(handoff_row(slurm_conf, &text, key, check, ours, without));
    }
    rows
}

/// One of the Prolog= and Epilog= programs (`key`): whether the `ours` it names finds the
/// handoff beside it (`without`: what fails when not).
fn handoff_row(
    slurm_conf: &Path,
    text: &str,
    key: &str,
    check: &str,
    ours: &str,
    without: &str,
) -> Row {
    use tenancy_node::run::DYNAMIC_BUILD;
    let named: Vec<PathBuf> = programs(text, key).into_iter().map(PathBuf::from).collect();
    let is = |p: &PathBuf, n: &str| p.file_name().is_some_and(|f| f == n);
    if key == "Prolog" && named.iter().any(|p| is(p, DYNAMIC_BUILD)) {
        return row(
            check,
            Severity::Ok,
            format!("Prolog= runs {DYNAMIC_BUILD}, which hands nothing off"),
            None,
        );
    }
    let Some(program) = named.iter().find(|p| is(p, ours)) else {
        // A wrapper script or a glob may still run it: say so, without failing the node.
        return row(
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
        );
    };
    let handoff = program.with_file_name(DYNAMIC_BUILD);
    let runnable = std::fs::metadata(&handoff).is_ok_and(|m| {
        m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
    });
    if runnable {
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
    }
}

/// slurm.conf: the prolog handoff, job_submit, job_container and the containment of jobs'
/// processes.
pub(super) fn slurm_rows(
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

#[cfg(test)]
mod tests {
    use super::{job_container_row, job_submit_row};

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
}
