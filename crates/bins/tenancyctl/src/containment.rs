//! `tenancyctl doctor`, check group `containment.*`: for each way Slurm starts a process for a
//! job, whether that process is born inside the job's isolation on this node, and how
//! (ARCHITECTURE.md, "Task and sessions").

use std::path::{Path, PathBuf};
use tenancy_cgroup::layout::{CgroupLayout, LayoutKind};
use tenancy_config::Config;
use tenancy_devices::doctor::Severity;

/// One finding: check, severity, message, remedy.
pub type Finding = (&'static str, Severity, String, Option<String>);

/// What the SPANK plugin's line in the plugin stack says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpankLine {
    /// `required .../libspank_tenancy.so` (file:line).
    Required(String),
    /// Listed `optional`: Slurm runs jobs without it when it fails to load (file:line).
    Optional(String),
    Missing,
}

/// Finds the product's SPANK plugin in the plugin stack file `plugstack` and the files its
/// `include` lines name (globs, as Slurm reads them; relative to the stack's folder).
pub fn spank_line(plugstack: &Path) -> SpankLine {
    let mut files = vec![plugstack.to_path_buf()];
    let mut found = SpankLine::Missing;
    let mut i = 0;
    while i < files.len() && i < 64 {
        let file = files[i].clone();
        i += 1;
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let words: Vec<&str> = line
                .split('#')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .collect();
            match words.as_slice() {
                ["include", pattern, ..] => {
                    let base = file.parent().unwrap_or(Path::new("/"));
                    files.extend(glob_files(base, pattern));
                }
                [kind @ ("required" | "optional"), so, ..] if so.contains("spank_tenancy") => {
                    let at = format!("{}:{}", file.display(), n + 1);
                    if *kind == "required" {
                        return SpankLine::Required(at);
                    }
                    found = SpankLine::Optional(at);
                }
                _ => {}
            }
        }
    }
    found
}

/// The files an `include` pattern names: a path whose last component may hold `*`.
fn glob_files(base: &Path, pattern: &str) -> Vec<PathBuf> {
    let p = base.join(pattern);
    let (Some(dir), Some(name)) = (p.parent(), p.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    if !name.contains('*') {
        return vec![p.clone()];
    }
    let (pre, post) = name.split_once('*').unwrap_or((name, ""));
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.len() >= pre.len() + post.len() && n.starts_with(pre) && n.ends_with(post)
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// The plugin stack slurm.conf names (`PlugStackConfig=`, else plugstack.conf beside it).
pub fn plugstack_of(slurm_conf: &Path, text: Option<&str>) -> PathBuf {
    text.and_then(|t| {
        t.lines()
            .map(|l| l.split('#').next().unwrap_or_default().trim())
            .filter_map(|l| l.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("PlugStackConfig"))
            .map(|(_, v)| PathBuf::from(v.trim()))
    })
    .unwrap_or_else(|| {
        slurm_conf
            .parent()
            .unwrap_or(Path::new("/etc/slurm"))
            .join("plugstack.conf")
    })
}

/// The `containment.*` rows. `ssh` is the verdict of the PAM check (`slurm.pam_adopt`): Some(true)
/// when every service that adopts sessions also joins them to the job's isolation.
pub fn findings(
    config: &Config,
    slurm_conf: &Path,
    slurm_text: Option<&str>,
    layout: &CgroupLayout,
    ssh: Option<bool>,
) -> Vec<Finding> {
    let mut out: Vec<Finding> = Vec::new();
    let stack = plugstack_of(slurm_conf, slurm_text);
    let hook = spank_line(&stack);
    out.push(spank_row(&stack, &hook));
    if matches!(hook, SpankLine::Required(_)) {
        out.extend(task_rows(layout));
    }
    if let Some(text) = slurm_text {
        out.push(extern_step_row(text, layout, ssh.is_some()));
    }
    out.push(ssh_row(ssh));
    out.extend(get_user_env_rows(config));
    out.push(outside_jobs_row(Path::new("/proc")));
    out
}

/// Whether plugstack.conf (`stack`) loads the SPANK plugin as `required`.
fn spank_row(stack: &Path, hook: &SpankLine) -> Finding {
    let no_plugin = |what: &str| -> Finding {
        (
            "containment.spank",
            Severity::Error,
            format!(
                "{} does not load libspank_tenancy.so as `required`: {what} would run outside \
                 the job's isolation",
                stack.display()
            ),
            Some(format!(
                "add `required /usr/lib/{}-linux-gnu/slurm-wlm/libspank_tenancy.so \
                 config=/etc/slurm/tenancy.toml` to {} (or a file it includes)",
                std::env::consts::ARCH,
                stack.display()
            )),
        )
    };
    match hook {
        SpankLine::Required(at) => (
            "containment.spank",
            Severity::Ok,
            format!("libspank_tenancy.so is required ({at})"),
            None,
        ),
        SpankLine::Optional(at) => (
            "containment.spank",
            Severity::Error,
            format!(
                "libspank_tenancy.so is only `optional` ({at}): a job whose plugin fails to load \
                 runs its tasks outside its isolation"
            ),
            Some("make the line `required`".into()),
        ),
        SpankLine::Missing => no_plugin("every task, task prolog and epilog"),
    }
}

/// Where a job's tasks and what slurmstepd starts for them run, on this cgroup layout.
fn task_rows(layout: &CgroupLayout) -> Vec<Finding> {
    let mut out = Vec::new();
    let pure_v2 = layout.kind == LayoutKind::Unified;
    let scope = pure_v2.then(tenancy_network::slurm_scope).flatten();
    out.push(match (&scope, pure_v2) {
        (Some(scope), _) => (
            "containment.tasks",
            Severity::Ok,
            format!(
                "pure cgroup v2 with Slurm's cgroup/v2 plugin ({}): the isolation is anchored \
                 in Slurm's job cgroup (the node device program on the scope, the firewall's \
                 jobs maps at level {}), every process of a job stays where Slurm puts it, \
                 under Slurm's memory and CPU limits, and a task found outside its job's \
                 folder fails before user code",
                scope.dir().display(),
                scope.job_level()
            ),
            None,
        ),
        (None, true) => (
            "containment.tasks",
            Severity::Warn,
            "pure cgroup v2 without Slurm's slurmstepd scope (Slurm's cgroup/v2 plugin not \
             in use): each task is moved into the product's job cgroup \
             (task_init_privileged, and again at task_post_fork after Slurm's own attach)"
                .to_string(),
            Some(
                "set CgroupPlugin=cgroup/v2 (cgroup.conf) with ProctrackType=proctrack/cgroup \
                 so Slurm's limits and the isolation share one job cgroup"
                    .to_string(),
            ),
        ),
        (None, false) => (
            "containment.tasks",
            Severity::Ok,
            "the batch script and every step's tasks (srun, --overlap, salloc's interactive \
             step, srun --pty): each task enters the job's cgroups itself before exec \
             (task_init_privileged) and slurmstepd puts it there again after Slurm's own \
             proctrack and task plugins placed it (task_post_fork), so no attach of Slurm's \
             moves it back out; Slurm's limits stay on its cgroup v1 hierarchies"
                .to_string(),
            None,
        ),
    });
    out.push((
        "containment.task_scripts",
        Severity::Ok,
        "task prologs and epilogs (srun --task-prolog/--task-epilog, slurm.conf TaskProlog/\
         TaskEpilog), MPI/PMIx helpers and X11 forwarding: slurmstepd itself joins the job's \
         cgroups and IPC namespace (task_post_fork; the extern step's at spank init, before \
         it forks), so what it starts for the job is born inside, and the epilog ends it"
            .into(),
        None,
    ));
    out
}

/// Whether ssh sessions adopted into jobs join their isolation (`None`: none is adopted).
fn ssh_row(ssh: Option<bool>) -> Finding {
    match ssh {
        Some(true) => (
            "containment.ssh",
            Severity::Ok,
            "ssh sessions adopted into a job join its isolation (pam_tenancy.so or tenancyctl \
             adopt; see slurm.pam_adopt)"
                .into(),
            None,
        ),
        Some(false) => (
            "containment.ssh",
            Severity::Error,
            "ssh sessions adopted into a job do not join its isolation (see slurm.pam_adopt)"
                .into(),
            Some("add pam_tenancy.so to the PAM service after pam_slurm_adopt".into()),
        ),
        None => (
            "containment.ssh",
            Severity::Ok,
            "no PAM service adopts ssh sessions into jobs (pam_slurm_adopt is not enabled)".into(),
            None,
        ),
    }
}

/// Tiers that let slurmd run the user's login shell as root before the job (--get-user-env).
fn get_user_env_rows(config: &Config) -> Vec<Finding> {
    let mut out = Vec::new();
    let allowing: Vec<&str> = config
        .tiers
        .values()
        .filter(|t| t.allow_get_user_env)
        .map(|t| t.name.as_str())
        .collect();
    if allowing.is_empty() {
        out.push((
            "containment.get_user_env",
            Severity::Ok,
            "no tier allows --get-user-env: the job_submit plugin refuses jobs that ask slurmd \
             for the user's login environment (see slurm.job_submit)"
                .into(),
            None,
        ));
    } else {
        for tier in allowing {
            out.push((
                "containment.get_user_env",
                Severity::Warn,
                format!(
                    "tier '{tier}' allows --get-user-env (allow_get_user_env = true): for its \
                     jobs slurmd runs `su - <user>` as root before the job starts, outside every \
                     job's isolation, and the user's login files can leave a process there that \
                     outlives the job"
                ),
                Some(format!(
                    "set allow_get_user_env = false in [tiers.{tier}] unless its users need \
                     scrontab or --get-user-env"
                )),
            ));
        }
    }
    out
}

/// Whether slurm.conf's `PrologFlags` gives every job an extern step (`Contain`, or `X11`,
/// which implies it; the last `PrologFlags=` line counts, as in Slurm).
pub fn prolog_flags_contain(slurm_conf: &str) -> bool {
    slurm_conf
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .filter_map(|l| l.split_once('='))
        .rfind(|(k, _)| k.trim().eq_ignore_ascii_case("PrologFlags"))
        .is_some_and(|(_, v)| {
            v.split(',')
                .any(|f| matches!(f.trim().to_ascii_lowercase().as_str(), "contain" | "x11"))
        })
}

/// `PrologFlags=Contain`: the extern step, what it holds, and what follows without it (Slurm's
/// cgroup/v2 plugin removes a job's folder after its last running step; the keeper holds it).
fn extern_step_row(slurm_conf: &str, layout: &CgroupLayout, adopts_ssh: bool) -> Finding {
    let pure_v2 = layout.kind == LayoutKind::Unified;
    let folder = if pure_v2 {
        " On this pure cgroup v2 node Slurm's cgroup/v2 plugin removes a job's folder when its \
         last running step ends and makes it again, with a new cgroup id, for the next; the \
         prolog's keeper folder (job_<id>/tenancy-keeper) keeps it, so the job's device program \
         and firewall stay keyed on one folder for its whole life, and a task found in a folder \
         made again fails before user code."
    } else {
        ""
    };
    if prolog_flags_contain(slurm_conf) {
        (
            "containment.extern_step",
            Severity::Ok,
            format!(
                "PrologFlags has Contain: every job has an extern step from its allocation to \
                 its end (ssh sessions pam_slurm_adopt adopts and X11 forwarding run in it, \
                 inside the job's isolation). Its owner can end it (scancel -s KILL \
                 <job>.extern), which leaves the job's steps as without Contain.{folder}"
            ),
            None,
        )
    } else {
        (
            "containment.extern_step",
            if adopts_ssh {
                Severity::Warn
            } else {
                Severity::Info
            },
            format!(
                "PrologFlags has no Contain: jobs have no extern step, so pam_slurm_adopt has \
                 no step to adopt ssh sessions into and Slurm's X11 forwarding is off, and \
                 without Alloc the prolog runs at a job's first step, not at its \
                 allocation.{folder}"
            ),
            Some(
                "set PrologFlags=Alloc,Contain in slurm.conf where ssh sessions into jobs \
                 (pam_slurm_adopt) or X11 forwarding are used"
                    .into(),
            ),
        )
    }
}

/// Root daemons that start a user's processes outside any job (cron, at, a lingering systemd
/// user manager): such a process is outside the tenant cgroups the firewall keys on.
fn outside_jobs_row(proc: &Path) -> Finding {
    let mut running: Vec<String> = Vec::new();
    for e in std::fs::read_dir(proc).into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let comm = comm.trim();
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let user_manager = comm == "systemd" && cmdline.windows(6).any(|w| w == b"--user");
        if matches!(comm, "cron" | "crond" | "atd") || user_manager {
            let name = if user_manager { "systemd --user" } else { comm };
            if !running.iter().any(|r| r.starts_with(name)) {
                running.push(format!("{name} (pid {pid})"));
            }
        }
    }
    if running.is_empty() {
        (
            "containment.outside_jobs",
            Severity::Ok,
            "no cron, at or systemd user manager runs here to start users' processes outside \
             their jobs"
                .into(),
            None,
        )
    } else {
        (
            "containment.outside_jobs",
            Severity::Warn,
            format!(
                "{} can start a job user's processes outside every job (user crontabs, at, \
                 systemd-run --user): those are outside the job's isolation and outlive it",
                running.join(", ")
            ),
            Some(
                "on compute nodes, allow cron and at to admins only (cron.allow, at.allow) and \
                 disable lingering (loginctl disable-linger)"
                    .into(),
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prolog_flags_contain_is_read_as_slurm_does() {
        assert!(prolog_flags_contain("PrologFlags=Alloc,Contain\n"));
        assert!(prolog_flags_contain("prologflags = alloc, contain # ssh\n"));
        assert!(prolog_flags_contain("PrologFlags=X11\n"));
        assert!(!prolog_flags_contain("PrologFlags=Alloc\n"));
        assert!(!prolog_flags_contain("#PrologFlags=Contain\n"));
        assert!(!prolog_flags_contain(
            "PrologFlags=Contain\nPrologFlags=Alloc\n"
        ));
        assert!(!prolog_flags_contain(""));
        let pure = CgroupLayout::parse("30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
        let (check, sev, msg, _) = extern_step_row("PrologFlags=Alloc\n", &pure, true);
        assert_eq!((check, sev), ("containment.extern_step", Severity::Warn));
        assert!(msg.contains("tenancy-keeper"), "{msg}");
        let (_, sev, _, remedy) = extern_step_row("PrologFlags=Alloc,Contain\n", &pure, true);
        assert_eq!((sev, remedy), (Severity::Ok, None));
    }

    #[test]
    fn the_plugin_is_found_through_includes_and_optional_is_not_enough() {
        let d = tempfile::tempdir().unwrap();
        let stack = d.path().join("plugstack.conf");
        std::fs::write(&stack, "# none\n").unwrap();
        assert_eq!(spank_line(&stack), SpankLine::Missing);
        std::fs::create_dir(d.path().join("plugstack.conf.d")).unwrap();
        std::fs::write(
            d.path().join("plugstack.conf.d/tenancy.conf"),
            "optional /usr/lib/libspank_tenancy.so\n",
        )
        .unwrap();
        std::fs::write(&stack, "include plugstack.conf.d/*.conf\n").unwrap();
        assert!(matches!(spank_line(&stack), SpankLine::Optional(_)));
        std::fs::write(
            d.path().join("plugstack.conf.d/tenancy.conf"),
            "required /usr/lib/libspank_tenancy.so config=/x\n",
        )
        .unwrap();
        let SpankLine::Required(at) = spank_line(&stack) else {
            panic!("not found")
        };
        assert!(at.ends_with("tenancy.conf:1"), "{at}");
        assert_eq!(
            plugstack_of(
                Path::new("/etc/slurm/slurm.conf"),
                Some("PlugStackConfig=/x/p\n")
            ),
            Path::new("/x/p")
        );
        assert_eq!(
            plugstack_of(Path::new("/etc/slurm/slurm.conf"), None),
            Path::new("/etc/slurm/plugstack.conf")
        );
    }
}
