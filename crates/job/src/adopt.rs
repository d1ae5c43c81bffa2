//! ssh sessions that `pam_slurm_adopt` puts into a running job. pam_slurm_adopt (PAM account
//! phase) moves the session's process into the job's extern step, which never passes through
//! the SPANK task hook, so the process would run outside the job's device allowlist and
//! firewall. In the session phase after it, the PAM module `pam_tenancy.so` (in the session's
//! own process, which also gets the job's environment) or `tenancyctl adopt` (through pam_exec,
//! moving its parent) finds the job the process was adopted into and moves it into the job's
//! isolation as the task hook does a task, or refuses the session ([`session`]).

use crate::task::{self, TaskEnv};
use tenancy_audit_log::{AuditLog, Event, Outcome, Record};
use tenancy_config::{user_uid, Config};

/// What [`adopt`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adopted {
    /// The process is in no Slurm job: an ordinary login (pam_slurm_adopt lets some through,
    /// e.g. administrators), nothing to isolate.
    NotInJob,
    /// Moved into job `job`'s isolation (`node` as the job's journal names this node).
    Joined {
        job: u64,
        tenant: String,
        tier: String,
        node: String,
        env: TaskEnv,
    },
}

/// Why [`adopt`] refused a session, with the job when one was found and the node as its
/// journal names this node when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub job: Option<u64>,
    pub node: Option<String>,
    pub reason: String,
}

impl Refused {
    fn new(job: Option<u64>, reason: String) -> Refused {
        Refused {
            job,
            node: None,
            reason,
        }
    }
}

/// The Slurm job a process belongs to, from the text of its `/proc/<pid>/cgroup`: the
/// `job_<id>` component of its cgroup paths (`/slurm/uid_1000/job_42/step_extern` under cgroup
/// v1, `/system.slice/slurmstepd.scope/job_42/step_extern` under v2), outside the product's own
/// tree (`/<product_dir>/<tenant>/job_<id>`). Two different jobs in one process's paths is an
/// error: which one's isolation applies would be a guess.
pub fn slurm_job_of(cgroup_text: &str, product_dir: &str) -> Result<Option<u64>, String> {
    let mut found: Option<u64> = None;
    for line in cgroup_text.lines() {
        // hierarchy-id:controllers:path, and the path may itself hold ':'.
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        let mut parts = path.split('/').filter(|c| !c.is_empty()).peekable();
        if parts.peek() == Some(&product_dir) {
            continue;
        }
        let job = parts.find_map(|c| c.strip_prefix("job_")?.parse::<u64>().ok());
        match (found, job) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "the process is in the cgroups of two jobs ({a} and {b})"
                ))
            }
            (None, Some(b)) => found = Some(b),
            _ => {}
        }
    }
    Ok(found)
}

/// Slurm 26.05's cgroup/v2 names a job's folder by its SLUID (`sEKNKTV3WPV500`: `s` and 13
/// Crockford base32 characters) instead of `job_<id>`; the job id is not in the path then. The
/// remedy for a refusal that this explains, or "".
fn sluid_remedy(cgroup_text: &str) -> &'static str {
    let sluid = |c: &str| {
        c.len() == 14
            && c.starts_with('s')
            && c[1..]
                .bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
    };
    let named_by_sluid = cgroup_text
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .any(|p| p.split('/').any(sluid));
    if named_by_sluid {
        " (Slurm 26.05 names job cgroups by SLUID: set CgroupJobIdPaths=yes in cgroup.conf and \
         restart slurmd, so that the job id is in the path)"
    } else {
        ""
    }
}

/// Moves process `pid`, a session of user `uid`, into the isolation of the Slurm job it was
/// adopted into. Refuses when the job has no journal on this node, belongs to another user, or
/// a cgroup cannot be joined: the session must not run beside the job unisolated.
///
/// `claimed` is the job pam_slurm_adopt says it adopted the session into (it sets SLURM_JOB_ID
/// in the PAM environment). The job is always taken from the process's cgroups; a claim they do
/// not bear out (no job, or another one) is refused rather than guessed at. The claim can only
/// refuse: PAM environments may hold values a user set.
pub fn adopt(
    config: &Config,
    pid: i32,
    uid: u32,
    claimed: Option<u64>,
    product_dir: &str,
) -> Result<Adopted, Refused> {
    let proc_cgroup = format!("/proc/{pid}/cgroup");
    let text = std::fs::read_to_string(&proc_cgroup)
        .map_err(|e| Refused::new(claimed, format!("cannot read {proc_cgroup}: {e}")))?;
    let found = slurm_job_of(&text, product_dir)
        .map_err(|e| Refused::new(claimed, format!("process {pid}: {e}")))?;
    let job = match (found, claimed) {
        (None, None) => return Ok(Adopted::NotInJob),
        // Slurm 26.05 names the job's folder by SLUID: the claim holds when the job's journal
        // anchors its isolation in the folder the process is in (recorded by the prolog).
        (None, Some(c)) if anchored_in(config, c, &text) => c,
        (None, Some(c)) => {
            return Err(Refused::new(
                Some(c),
                format!(
                    "pam_slurm_adopt adopted the session into job {c}, but process {pid} is in \
                     no job's cgroup{}",
                    sluid_remedy(&text)
                ),
            ))
        }
        (Some(j), Some(c)) if j != c => {
            return Err(Refused::new(
                Some(c),
                format!(
                    "pam_slurm_adopt adopted the session into job {c}, but process {pid} is in \
                     job {j}'s cgroup"
                ),
            ))
        }
        (Some(j), _) => j,
    };
    let refused = |reason: String| Refused::new(Some(job), reason);
    let journals =
        crate::JournalDir::open(&config.cluster.state_dir).map_err(|e| refused(e.to_string()))?;
    let journal = journals
        .load_unlocked(job)
        .map_err(|e| refused(format!("job {job}: {e}")))?
        .ok_or_else(|| {
            refused(format!(
                "job {job}: no journal in {}: the tenancy prolog did not set this job up on this \
                 node, so a session in it would run unisolated",
                config.cluster.state_dir.display()
            ))
        })?;
    let refused = |reason: String| Refused {
        node: Some(journal.node.clone()),
        ..refused(reason)
    };
    if journal.uid != uid {
        return Err(refused(format!(
            "job {job} belongs to uid {} ({}), not to the session's uid {uid}",
            journal.uid, journal.user
        )));
    }
    let env = task::enter_journal(&journal, pid).map_err(refused)?;
    // A session that enters itself (pam_tenancy) gets an abstract-socket domain of its own;
    // `tenancyctl adopt` moves its parent, which only the parent could put in one.
    if u32::try_from(pid) == Ok(std::process::id()) {
        crate::abstract_sockets::scope_self()
            .map_err(|e| refused(format!("job {job}: abstract sockets: {e}")))?;
    }
    Ok(Adopted::Joined {
        job,
        tenant: journal.tenant,
        tier: journal.tier,
        node: journal.node,
        env,
    })
}

/// Whether job `job`'s journal on this node anchors its isolation in a Slurm job folder that
/// holds the process whose `/proc/<pid>/cgroup` is `cgroup_text` (pure cgroup v2).
fn anchored_in(config: &Config, job: u64, cgroup_text: &str) -> bool {
    let Some(own) = tenancy_cgroup::slurm::v2_path_in(cgroup_text) else {
        return false;
    };
    let own = std::path::Path::new(tenancy_cgroup::layout::STANDARD_V2_MOUNTS[0])
        .join(own.trim_start_matches('/'));
    let Ok(journals) = crate::JournalDir::open(&config.cluster.state_dir) else {
        return false;
    };
    let Ok(Some(journal)) = journals.load_unlocked(job) else {
        return false;
    };
    task::anchors(&journal).iter().any(|a| own.starts_with(a))
}

/// What the session phase decided about a login ([`session`]), its audit record written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Session {
    /// The process is in no Slurm job: an ordinary login (pam_slurm_adopt lets some through,
    /// e.g. administrators), nothing to isolate.
    NotInJob,
    /// Joined job `job`'s isolation; `env` is what the job's tasks get (CUDA_VISIBLE_DEVICES,
    /// TMPDIR, ...).
    Joined {
        job: u64,
        tenant: String,
        env: TaskEnv,
    },
    /// The session must end; `message` names the session, the job and why.
    Refused { message: String },
}

/// The session phase of a login that pam_slurm_adopt may have adopted into a job: moves
/// process `pid` of `user` into the job's isolation ([`adopt`]) and writes the audit record,
/// `session_adopted` (a session whose record cannot be written is refused: no record, no
/// session) or, when a job was found, `session_refused` (best effort: the session is refused
/// either way). `claimed` is SLURM_JOB_ID from the PAM environment; `source` names the program
/// in the record.
pub fn session(
    config: &Config,
    pid: i32,
    user: &str,
    claimed: Option<&str>,
    source: &str,
) -> Session {
    let refuse = |job: Option<u64>, node: Option<String>, why: String, uid: u32| {
        let message = format!("refusing the session of {user} (process {pid}): {why}");
        if let Some(job) = job {
            let node = node.unwrap_or_else(|| this_node(config));
            let mut rec = record(config, &node, user, uid, source, "session_refused")
                .job_id(job)
                .reason(format!("ssh session process {pid}: {why}"));
            if let Err(e) = append(config, &mut rec) {
                return Session::Refused {
                    message: format!("{message} (the session_refused record was not written: {e})"),
                };
            }
        }
        Session::Refused { message }
    };
    let Some(uid) = user_uid(user) else {
        return refuse(None, None, format!("user {user} is not in NSS"), u32::MAX);
    };
    let claimed = match claimed.map(|v| (v, v.parse::<u64>())) {
        None => None,
        Some((_, Ok(j))) => Some(j),
        Some((v, Err(_))) => {
            return refuse(
                None,
                None,
                format!("SLURM_JOB_ID {v:?} is not a job id"),
                uid,
            )
        }
    };
    match adopt(config, pid, uid, claimed, tenancy_cgroup::PRODUCT_DIR) {
        Ok(Adopted::NotInJob) => Session::NotInJob,
        Ok(Adopted::Joined {
            job,
            tenant,
            tier,
            node,
            env,
        }) => {
            // As no job runs without its job_start, no session joins a job without its record.
            let mut rec = record(config, &node, user, uid, source, "session_adopted")
                .job_id(job)
                .tenant(tenant.clone())
                .tier(tier)
                .reason(format!(
                    "ssh session process {pid} joined the job's isolation"
                ));
            match append(config, &mut rec) {
                Ok(()) => Session::Joined { job, tenant, env },
                Err(e) => refuse(
                    Some(job),
                    Some(node),
                    format!("its audit record cannot be written: {e}"),
                    uid,
                ),
            }
        }
        Err(Refused { job, node, reason }) => refuse(job, node, reason, uid),
    }
}

/// A session record: `session_adopted` is a success, anything else a denial.
fn record(config: &Config, node: &str, user: &str, uid: u32, source: &str, event: &str) -> Record {
    let outcome = if event == "session_adopted" {
        Outcome::Success
    } else {
        Outcome::Denied
    };
    Record::new(
        config.cluster.name.clone(),
        node,
        user,
        uid,
        Event::Other(event.into()),
        outcome,
        source,
    )
}

fn append(config: &Config, rec: &mut Record) -> Result<(), String> {
    crate::audit::append_anchored(config, rec).map(|_| ())
}

/// The node name this node's audit chain uses: that of the log's last record (the prolog
/// writes SLURMD_NODENAME, which need not be the host name), else the short host name.
fn this_node(config: &Config) -> String {
    AuditLog::open(&config.cluster.audit_log)
        .and_then(|log| log.head())
        .ok()
        .and_then(|h| h.node)
        .unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .and_then(|h| h.trim().split('.').next().map(String::from))
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "localhost".into())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_is_read_from_slurms_cgroup_paths() {
        let v1 = "12:devices:/slurm/uid_1000/job_42/step_extern\n\
                  5:memory:/slurm/uid_1000/job_42/step_extern\n\
                  1:name=systemd:/user.slice\n0::/user.slice/user-1000.slice/session-3.scope\n";
        assert_eq!(slurm_job_of(v1, "tenancy"), Ok(Some(42)));
        let v2 = "0::/system.slice/slurmstepd.scope/job_7/step_extern/user/task_special\n";
        assert_eq!(slurm_job_of(v2, "tenancy"), Ok(Some(7)));
        // The product's own tree is not Slurm's: already joined, the job comes from Slurm's.
        let both = "4:devices:/slurm/uid_1000/job_42/step_extern\n0::/tenancy/acme/job_42\n";
        assert_eq!(slurm_job_of(both, "tenancy"), Ok(Some(42)));
        assert_eq!(
            slurm_job_of("0::/tenancy/acme/job_42\n", "tenancy"),
            Ok(None)
        );
        // No job: an ordinary login.
        assert_eq!(
            slurm_job_of("0::/user.slice/user-0.slice/session-1.scope\n", "tenancy"),
            Ok(None)
        );
        // Not a job id, and a path with ':' in it.
        assert_eq!(slurm_job_of("0::/x/job_abc/y:z\n", "tenancy"), Ok(None));
        assert!(slurm_job_of(
            "12:devices:/slurm/uid_1/job_1/step_extern\n0::/system.slice/slurmstepd.scope/job_2\n",
            "tenancy"
        )
        .unwrap_err()
        .contains("two jobs (1 and 2)"));
    }

    #[test]
    fn a_job_cgroup_named_by_sluid_gets_the_remedy() {
        let v2 = "0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_extern/user\n";
        assert_eq!(super::slurm_job_of(v2, "tenancy"), Ok(None));
        assert!(super::sluid_remedy(v2).contains("CgroupJobIdPaths=yes"));
        let by_id = "0::/system.slice/slurmstepd.scope/job_7/step_extern\n";
        assert_eq!(super::sluid_remedy(by_id), "");
        assert_eq!(super::sluid_remedy("0::/system.slice/sshd.service\n"), "");
    }
}
