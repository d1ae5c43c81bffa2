//! The job side of the SPANK plugin: before user code runs, slurmstepd (root) puts each task
//! into the job's isolation and gives it the job's environment, both read from the journal the
//! prolog wrote.
//!
//! Layers say what a task must join and the environment it gets through the contract keys of
//! their made values ([`crate::contract`]): cgroup directories whose `cgroup.procs` the task is
//! written into (the device allowlist and the firewall key on them), and variables.

use crate::contract::{self, Facing, TaskEntry};
use crate::journal::{Journal, JournalDir, StepState};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tenancy_config::Config;

/// Variables to set in the task's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEnv {
    pub vars: Vec<(String, String)>,
}

/// Moves `pid` into the job's cgroups and returns the job's environment. Fails (so the step
/// fails, never unisolated) when the job has no journal or a cgroup cannot be joined.
pub fn enter(config: &Config, job_id: u64, pid: i32) -> Result<TaskEnv, String> {
    enter_journal(&running_journal(config, job_id)?, pid)
}

/// The journal of a job that is to run on this node: none means the prolog did not set the
/// job up here, and nothing of it may run.
fn running_journal(config: &Config, job_id: u64) -> Result<Journal, String> {
    let journals = JournalDir::open(&config.cluster.state_dir).map_err(|e| e.to_string())?;
    journals
        .load_unlocked(job_id)
        .map_err(|e| format!("job {job_id}: {e}"))?
        .ok_or_else(|| {
            format!(
                "job {job_id}: no journal in {}: the tenancy prolog did not set this job up on \
                 this node (is Prolog=tenancy-prolog in slurm.conf? Slurm 22.05 may run no \
                 prolog for a requeued job's next run: requeue it again)",
                config.cluster.state_dir.display()
            )
        })
}

/// [`enter`] for a task whose slurmstepd is already in the job's isolation: the task was born
/// in the job's IPC namespace (slurmstepd joined it at `slurm_spank_init`, before it forked),
/// and looks for no other (it could not: the step's Landlock domain, which it inherited, hides
/// other processes' namespaces from it).
pub fn enter_inherited(config: &Config, job_id: u64, pid: i32) -> Result<TaskEnv, String> {
    enter_with(&running_journal(config, job_id)?, pid, false)
}

/// [`enter`] with the job's journal already read.
pub fn enter_journal(journal: &Journal, pid: i32) -> Result<TaskEnv, String> {
    enter_with(journal, pid, true)
}

/// [`enter_journal`]; `join_ipc`: a process that enters itself also joins the job's IPC
/// namespace.
fn enter_with(journal: &Journal, pid: i32, join_ipc: bool) -> Result<TaskEnv, String> {
    let job_id = journal.job_id;
    let mut joined: Vec<&Path> = Vec::new();
    let entries = made_entries(journal)?;
    for (layer, entry) in &entries {
        for p in &entry.join_cgroups {
            // Layers may share one cgroup (devices and network key on the job's).
            if joined.contains(&p.as_path()) {
                continue;
            }
            joined.push(p);
            join(p, pid).map_err(|e| format!("job {job_id}: layer {layer}: {e}"))?;
        }
    }
    let anchors = anchors_of(&entries);
    check_anchored(journal, &anchors, pid)?;
    // The job's IPC namespace, for a process that enters itself (a task, an ssh session
    // through pam_tenancy); `tenancyctl adopt` enters its parent, which it cannot move.
    if join_ipc && u32::try_from(pid) == Ok(std::process::id()) {
        let job_cgroup = joined
            .first()
            .map(|c| (*c, false))
            .or(anchors.first().map(|a| (a.dir.as_path(), true)));
        if let Some((cgroup, below)) = job_cgroup {
            join_job_ipc_of(cgroup, below).map_err(|e| format!("job {job_id}: ipc: {e}"))?;
        }
    }
    Ok(env_of(journal, &entries))
}

/// The environment every task of the job gets (what [`enter_journal`] returns), without
/// joining anything; an error when a layer is not set up.
pub fn job_env(journal: &Journal) -> Result<TaskEnv, String> {
    Ok(env_of(journal, &made_entries(journal)?))
}

/// The job's tenant, each layer's variables in layer order, then the variables every task gets
/// ([`contract::ENV_DEFAULTS`]) with a layer's value or their default.
fn env_of(journal: &Journal, entries: &[(&str, TaskEntry)]) -> TaskEnv {
    let mut vars = vec![("TENANCY_TENANT".to_string(), journal.tenant.clone())];
    let mut defaults: Vec<(String, String)> = contract::ENV_DEFAULTS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (k, v) in entries.iter().flat_map(|(_, e)| &e.env) {
        match defaults.iter_mut().find(|(d, _)| d == k) {
            Some(d) => d.1 = v.clone(),
            None => vars.push((k.clone(), v.clone())),
        }
    }
    vars.extend(defaults);
    TaskEnv { vars }
}

/// What each layer gives a task, in layer order; an error when a layer is not set up.
fn made_entries(journal: &Journal) -> Result<Vec<(&str, TaskEntry)>, String> {
    journal
        .steps
        .iter()
        .map(|step| match (&step.state, &step.made) {
            (StepState::Made, Some(m)) => {
                Ok((step.layer.as_str(), Facing::task_entry(&step.layer, m)))
            }
            _ => Err(format!(
                "job {}: layer {} is not set up (state {:?}); the job must not run",
                journal.job_id, step.layer, step.state
            )),
        })
        .collect()
}

/// Puts slurmstepd itself (and, after Slurm's own plugins placed it, one of its tasks) into the
/// job's cgroups, so that everything slurmstepd starts for the job from then on (the user's and
/// slurm.conf's task epilog, the extern step's X11 helpers, MPI/PMIx helpers, any step it
/// forks) is born inside the job's isolation. Called from the SPANK plugin in slurmstepd: for
/// every step from `slurm_spank_init`, before it opens the step's stdio files or connects to
/// anything for it (its own connections are told from the job's code by the firewall:
/// tenancy-network's stepd.rs), and again from `slurm_spank_task_post_fork` with the task,
/// after Slurm's proctrack and task plugins have attached it (so no attach of Slurm's can move
/// it back out afterwards). With `join_ipc` slurmstepd also enters the job's IPC namespace and
/// scopes its abstract UNIX sockets ([`crate::abstract_sockets`]), once per slurmstepd, in the
/// thread that forks the step's tasks. Fails when a layer is not set up
/// or a cgroup cannot be joined: the step then fails, never runs unisolated. A job with no
/// journal on the node (its prolog did not set it up here: a node without Prolog=) is
/// `Ok(None)`: its tasks fail closed in their own hook, before user code, and Slurm ends the
/// step as a failed job instead of failing the launch (which drains the node).
pub fn contain_step(
    config: &Config,
    job_id: u64,
    stepd: i32,
    task: Option<i32>,
    join_ipc: bool,
) -> Result<Option<Vec<PathBuf>>, String> {
    let journals = JournalDir::open(&config.cluster.state_dir).map_err(|e| e.to_string())?;
    let Some(journal) = journals
        .load_unlocked(job_id)
        .map_err(|e| format!("job {job_id}: {e}"))?
    else {
        return Ok(None);
    };
    let entries = made_entries(&journal)?;
    let cgroups = cgroups_of(&entries);
    for cg in &cgroups {
        for pid in task.into_iter().chain([stepd]) {
            join(cg, pid).map_err(|e| format!("job {job_id}: {e}"))?;
        }
    }
    // Anchored: the task after Slurm's own attach (slurmstepd places itself when it makes
    // the step's cgroup, which may come after `slurm_spank_init`).
    let anchors = anchors_of(&entries);
    if let Some(pid) = task {
        check_anchored(&journal, &anchors, pid)?;
    }
    if join_ipc {
        let job_cgroup = cgroups
            .first()
            .map(|c| (c.as_path(), false))
            .or(anchors.first().map(|a| (a.dir.as_path(), true)));
        if let Some((cg, below)) = job_cgroup {
            join_job_ipc_of(cg, below).map_err(|e| format!("job {job_id}: ipc: {e}"))?;
        }
        // The step's abstract UNIX sockets: one Landlock domain for what this thread forks.
        crate::abstract_sockets::scope_self()
            .map_err(|e| format!("job {job_id}: abstract sockets: {e}"))?;
    }
    Ok(Some(cgroups))
}

/// The cgroups every process of the job must be in (each once, in layer order); an error when a
/// layer is not set up, as for a task.
pub fn job_cgroups(journal: &Journal) -> Result<Vec<PathBuf>, String> {
    Ok(cgroups_of(&made_entries(journal)?))
}

/// The cgroups the layers' task entries name, each once, in layer order.
fn cgroups_of(entries: &[(&str, TaskEntry)]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in entries.iter().flat_map(|(_, e)| &e.join_cgroups) {
        if !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

/// Slurm's job folders the job's isolation is anchored in (pure cgroup v2 with Slurm's
/// cgroup/v2 plugin: the layers' task entry `anchor`), each once; none when a layer is not set
/// up (its tasks are refused anyway).
pub fn anchors(journal: &Journal) -> Vec<PathBuf> {
    made_entries(journal)
        .map(|e| anchors_of(&e).into_iter().map(|a| a.dir).collect())
        .unwrap_or_default()
}

/// A folder of Slurm's a layer keyed the job on, with the cgroup id it had then.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Anchor {
    dir: PathBuf,
    id: Option<u64>,
}

fn anchors_of(entries: &[(&str, TaskEntry)]) -> Vec<Anchor> {
    let mut out: Vec<Anchor> = Vec::new();
    for e in entries.iter().map(|(_, e)| e) {
        let Some(dir) = &e.anchor else { continue };
        let a = Anchor {
            dir: dir.clone(),
            id: e.anchor_id,
        };
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

/// Where the isolation is anchored in Slurm's job folder, a process of the job must be in it
/// (Slurm put it there), and the folder must be the one the job's firewall elements and device
/// program are keyed on: the same cgroup id as when the prolog made it (Slurm's cgroup/v2
/// plugin removes a job's folder when its last step ends and makes it again, with a new id, for
/// the next; the product's keeper prevents that, and a folder made again anyway is not the
/// job's isolation). Otherwise the process fails, never runs unisolated.
fn check_anchored(journal: &Journal, anchors: &[Anchor], pid: i32) -> Result<(), String> {
    for a in anchors {
        let mount = Path::new(tenancy_cgroup::layout::STANDARD_V2_MOUNTS[0]);
        match tenancy_cgroup::slurm::is_under(pid, mount, &a.dir) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "job {}: process {pid} is not in Slurm's job cgroup {} ({}), where the job's device program and firewall hold; is Slurm's CgroupPlugin=cgroup/v2 with ProctrackType=proctrack/cgroup in slurm.conf?",
                    journal.job_id,
                    a.dir.display(),
                    tenancy_cgroup::slurm::v2_path_of(pid).unwrap_or_default()
                ))
            }
            Err(e) => {
                return Err(format!(
                    "job {}: cannot tell whether process {pid} is in {}: {e}",
                    journal.job_id,
                    a.dir.display()
                ))
            }
        }
        let Some(want) = a.id else { continue };
        match tenancy_cgroup::slurm::cgroup_id(&a.dir) {
            Ok(id) if id == want => {}
            Ok(id) => {
                return Err(format!(
                    "job {}: Slurm's job cgroup {} was removed and made again (cgroup id {id}, \
                     not {want}, the one the job's device program and firewall are keyed on); \
                     its keeper folder {} was removed while the job ran. The job must end; \
                     check that nothing on the node removes job folders",
                    journal.job_id,
                    a.dir.display(),
                    a.dir.join(tenancy_cgroup::slurm::KEEPER).display()
                ))
            }
            Err(e) => {
                return Err(format!(
                    "job {}: cannot read the cgroup id of {}: {e}",
                    journal.job_id,
                    a.dir.display()
                ))
            }
        }
    }
    Ok(())
}

fn join(cgroup: &Path, pid: i32) -> Result<(), String> {
    tenancy_cgroup::job::join(cgroup, pid).map_err(|e| {
        format!(
            "cannot move task {pid} into {}: {}",
            cgroup.display(),
            e.reason()
        )
    })
}

/// How long [`end_tasks`] waits for a job's killed processes to leave its cgroups.
pub const END_WAIT: Duration = Duration::from_secs(5);

/// Kills every process still in the cgroups the job's tasks joined, and waits until they are
/// gone, before any layer is undone. On cgroup v2 the tasks left Slurm's step cgroups for the
/// job's own, so Slurm's process tracking no longer ends them at job end; a process that
/// outlived the job would otherwise race the wipe of its scratch folder or keep running after
/// its device program is detached. Errors name the layer, the cgroup and the pids left (the
/// caller names the job).
pub fn end_tasks(journal: &Journal, wait: Duration) -> Result<(), String> {
    let mut seen: Vec<PathBuf> = Vec::new();
    for step in journal
        .steps
        .iter()
        .filter(|s| s.state != StepState::Undone)
    {
        let paths = step
            .made
            .as_ref()
            .map(|m| Facing::task_entry(&step.layer, m).join_cgroups);
        for p in paths.into_iter().flatten() {
            if seen.contains(&p) {
                continue;
            }
            end_cgroup(&p, wait).map_err(|e| {
                format!(
                    "layer {}: {e}; every layer stays until they are gone, then run \
                     `tenancyctl reconcile --apply`",
                    step.layer
                )
            })?;
            seen.push(p);
        }
    }
    Ok(())
}

fn pids_in(cgroup: &Path) -> Result<Vec<i32>, String> {
    tenancy_cgroup::job::pids_in(cgroup).map_err(|e| e.to_string())
}

fn end_cgroup(cgroup: &Path, wait: Duration) -> Result<(), String> {
    tenancy_cgroup::job::end_all(cgroup, wait).map_err(|e| e.to_string())
}

fn pidfd_if_in(pid: i32, cgroup: &Path) -> Option<std::os::fd::OwnedFd> {
    tenancy_cgroup::job::pidfd_if_in(pid, cgroup)
}

/// Puts the calling process into its job's IPC namespace (SysV shared memory, semaphores and
/// message queues, POSIX message queues), made by the job's first process on the node: the
/// tasks of one job share IPC objects, jobs do not, so a segment one tenant's job creates with
/// loose permissions is not there for another's. The job's processes are those in `cgroup`
/// (the job's own, which the caller has joined); one of them outside the namespace the caller
/// starts in, the node's, is in the job's. The cgroup directory's lock orders the job's tasks, so that two starting at
/// once make one namespace. The namespace ends with the job's last process.
pub fn join_job_ipc(cgroup: &Path) -> Result<(), String> {
    join_job_ipc_of(cgroup, false)
}

/// [`join_job_ipc`] over the processes in `cgroup` and, with `below`, in the cgroups below it
/// (Slurm's job folder, whose processes are in its step and task folders).
fn join_job_ipc_of(cgroup: &Path, below: bool) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let ns = |pid: &str| {
        std::fs::metadata(format!("/proc/{pid}/ns/ipc"))
            .map(|m| (m.dev(), m.ino()))
            .map_err(|e| format!("cannot read /proc/{pid}/ns/ipc: {e}"))
    };
    // The caller has not left the namespace it started in, the node's (slurmstepd's, sshd's).
    let node = ns("self")?;
    let dir = std::fs::File::open(cgroup)
        .map_err(|e| format!("cannot open {}: {e}", cgroup.display()))?;
    rustix::fs::flock(&dir, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| format!("cannot lock {}: {e}", cgroup.display()))?;
    let me = std::process::id() as i32;
    let pids = if below {
        tenancy_cgroup::slurm::pids_below(cgroup)
            .map_err(|e| format!("cannot list {}: {e}", cgroup.display()))?
    } else {
        pids_in(cgroup)?
    };
    let mount = Path::new(tenancy_cgroup::layout::STANDARD_V2_MOUNTS[0]);
    let job_ns = pids
        .into_iter()
        .filter(|p| *p != me)
        .filter_map(|p| {
            if below {
                // The pidfd holds one process: if it is still below the folder, it is the job's.
                let fd = rustix::process::pidfd_open(
                    rustix::process::Pid::from_raw(p)?,
                    rustix::process::PidfdFlags::empty(),
                )
                .ok()?;
                tenancy_cgroup::slurm::is_under(p, mount, cgroup)
                    .ok()?
                    .then_some((p, fd))
            } else {
                pidfd_if_in(p, cgroup).map(|fd| (p, fd))
            }
        })
        .find(|(p, _)| ns(&p.to_string()).is_ok_and(|n| n != node));
    let (what, rc) = match &job_ns {
        // SAFETY: setns on a pidfd we own; it changes only this process's IPC namespace.
        Some((p, fd)) => (
            format!("join the IPC namespace of the job's process {p}"),
            unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWIPC) },
        ),
        // SAFETY: plain syscall; it changes only this process's IPC namespace.
        None => ("make the job's IPC namespace".to_string(), unsafe {
            libc::unshare(libc::CLONE_NEWIPC)
        }),
    };
    if rc != 0 {
        return Err(format!(
            "cannot {what}: {} (the node must allow namespaces: CAP_SYS_ADMIN)",
            std::io::Error::last_os_error()
        ));
    }
    // The lock goes with `dir`.
    Ok(())
}
