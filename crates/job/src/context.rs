//! The job as Slurm describes it to the prolog and epilog: environment variables only.
//!
//! slurmd gives these programs a fresh environment (no PATH); the submit side's choices arrive
//! as `SPANK_TENANCY_*` (set by the SPANK plugin through the job-control environment). Nothing
//! here is trusted: every value is checked, and a bad one is an error naming the variable.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use tenancy_config::request;

/// What the prolog/epilog know about the job, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobContext {
    pub job_id: u64,
    pub uid: u32,
    pub gid: u32,
    pub user: String,
    pub node: String,
    pub cluster: Option<String>,
    pub account: Option<String>,
    pub partition: Option<String>,
    /// `--tenant` as the user gave it at submit time (re-checked by the prolog).
    pub requested_tenant: Option<String>,
    /// `--mig` as the user gave it at submit time (re-checked by the prolog).
    pub requested_profile: Option<String>,
    /// GRES indexes slurmctld allocated (`SLURM_JOB_GPUS`), when the node has GPU GRES.
    pub gres_gpus: Option<Vec<u32>>,
}

/// A variable that is missing or malformed, plus what could be read before it failed, so the
/// denial can still be recorded against the job and user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvError {
    pub variable: &'static str,
    pub problem: String,
    pub job_id: Option<u64>,
    pub uid: Option<u32>,
    pub user: Option<String>,
    pub node: Option<String>,
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.variable, self.problem)?;
        if self.problem.contains("missing") {
            write!(
                f,
                " (this program must run as Slurm's Prolog/Epilog, which sets it)"
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for EnvError {}

struct Env {
    vars: Vec<(OsString, OsString)>,
}

impl Env {
    fn raw(&self, name: &str) -> Option<&OsString> {
        self.vars.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// The value as UTF-8 text of sane length, `Ok(None)` when unset or empty (checked as
    /// job_submit/tenancy checks the SPANK job environment: `tenancy_config::request`).
    fn text(&self, name: &'static str) -> Result<Option<String>, (&'static str, String)> {
        let Some(v) = self.raw(name) else {
            return Ok(None);
        };
        request::env_text(v.as_bytes()).map_err(|problem| (name, problem))
    }

    fn required(&self, name: &'static str) -> Result<String, (&'static str, String)> {
        self.text(name)?.ok_or((name, "is missing".to_string()))
    }

    fn number<T: std::str::FromStr>(
        &self,
        name: &'static str,
    ) -> Result<T, (&'static str, String)> {
        let s = self.required(name)?;
        if !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err((name, format!("is not a number: '{}'", s.escape_debug())));
        }
        s.parse()
            .map_err(|_| (name, format!("is out of range: '{s}'")))
    }
}

/// A name Slurm or NSS gave (user, node, account, partition), or why not: the same check as
/// job_submit/tenancy's, so what the controller accepted passes here.
fn plain_name(name: &'static str, v: String) -> Result<String, (&'static str, String)> {
    match request::name_problem(&v) {
        None => Ok(v),
        Some(problem) => Err((name, problem)),
    }
}

impl JobContext {
    /// Reads the context from this process's environment.
    pub fn from_process_env() -> Result<JobContext, EnvError> {
        Self::from_vars(std::env::vars_os())
    }

    pub fn from_vars(
        vars: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<JobContext, EnvError> {
        let env = Env {
            vars: vars.into_iter().collect(),
        };
        let mut partial = EnvError {
            variable: "",
            problem: String::new(),
            job_id: None,
            uid: None,
            user: None,
            node: None,
        };
        let fail = |mut partial: EnvError, (variable, problem): (&'static str, String)| {
            partial.variable = variable;
            partial.problem = problem;
            partial
        };
        // Read the identifying values first so a later failure can still name job and user.
        let job_id = env.number::<u64>("SLURM_JOB_ID");
        let uid = env.number::<u32>("SLURM_JOB_UID");
        let user = env
            .required("SLURM_JOB_USER")
            .and_then(|u| plain_name("SLURM_JOB_USER", u));
        let node = env
            .required("SLURMD_NODENAME")
            .and_then(|n| plain_name("SLURMD_NODENAME", n));
        partial.job_id = job_id.as_ref().ok().copied();
        partial.uid = uid.as_ref().ok().copied();
        partial.user = user.as_ref().ok().cloned();
        partial.node = node.as_ref().ok().cloned();

        let job_id = job_id.map_err(|e| fail(partial.clone(), e))?;
        if job_id == 0 {
            return Err(fail(partial, ("SLURM_JOB_ID", "is 0".to_string())));
        }
        let uid = uid.map_err(|e| fail(partial.clone(), e))?;
        let user = user.map_err(|e| fail(partial.clone(), e))?;
        let node = node.map_err(|e| fail(partial.clone(), e))?;
        let gid = env
            .number::<u32>("SLURM_JOB_GID")
            .map_err(|e| fail(partial.clone(), e))?;
        let optional_name = |name: &'static str| -> Result<Option<String>, EnvError> {
            match env.text(name).map_err(|e| fail(partial.clone(), e))? {
                Some(v) => plain_name(name, v)
                    .map(Some)
                    .map_err(|e| fail(partial.clone(), e)),
                None => Ok(None),
            }
        };
        let cluster = optional_name("SLURM_CLUSTER_NAME")?;
        let account = optional_name("SLURM_JOB_ACCOUNT")?;
        let partition = optional_name("SLURM_JOB_PARTITION")?;
        // The submit-side choices are checked against the config by the spine, which gives the
        // precise refusal; here only their transport is checked.
        let requested_tenant = env
            .text("SPANK_TENANCY_TENANT")
            .map_err(|e| fail(partial.clone(), e))?;
        let requested_profile = env
            .text("SPANK_TENANCY_MIG")
            .map_err(|e| fail(partial.clone(), e))?;
        let gres_gpus = match env
            .text("SLURM_JOB_GPUS")
            .map_err(|e| fail(partial.clone(), e))?
        {
            None => None,
            Some(list) => Some(
                list.split(',')
                    .map(|i| i.trim().parse::<u32>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| {
                        fail(
                            partial.clone(),
                            (
                                "SLURM_JOB_GPUS",
                                format!("is not a list of GPU indexes: '{list}'"),
                            ),
                        )
                    })?,
            ),
        };
        Ok(JobContext {
            job_id,
            uid,
            gid,
            user,
            node,
            cluster,
            account,
            partition,
            requested_tenant,
            requested_profile,
            gres_gpus,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    fn base() -> Vec<(OsString, OsString)> {
        [
            ("SLURM_JOB_ID", "42"),
            ("SLURM_JOB_UID", "1001"),
            ("SLURM_JOB_GID", "1001"),
            ("SLURM_JOB_USER", "alice"),
            ("SLURMD_NODENAME", "node1"),
            ("SLURM_CLUSTER_NAME", "demo"),
            ("SPANK_TENANCY_TENANT", "acme"),
            ("SPANK_TENANCY_MIG", "1g.18gb"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
    }

    fn with(name: &str, value: Option<OsString>) -> Result<JobContext, EnvError> {
        let mut v = base();
        v.retain(|(k, _)| k != name);
        if let Some(value) = value {
            v.push((name.into(), value));
        }
        JobContext::from_vars(v)
    }

    #[test]
    fn reads_a_good_environment() {
        let c = JobContext::from_vars(base()).unwrap();
        assert_eq!((c.job_id, c.uid, c.user.as_str()), (42, 1001, "alice"));
        assert_eq!(c.requested_tenant.as_deref(), Some("acme"));
        assert_eq!(c.account, None);
        assert_eq!(c.gres_gpus, None);
        let c = with("SLURM_JOB_GPUS", Some("3,5".into())).unwrap();
        assert_eq!(c.gres_gpus, Some(vec![3, 5]));
        // sssd's qualified names, and accounts as Slurm takes them.
        let c = with("SLURM_JOB_USER", Some("jdoe@example.org".into())).unwrap();
        assert_eq!(c.user, "jdoe@example.org");
        let c = with("SLURM_JOB_ACCOUNT", Some("acme-a.b$".into())).unwrap();
        assert_eq!(c.account.as_deref(), Some("acme-a.b$"));
    }

    #[test]
    fn each_bad_value_names_its_variable() {
        let cases: Vec<(&str, Option<OsString>, &str)> = vec![
            ("SLURM_JOB_ID", None, "SLURM_JOB_ID is missing"),
            (
                "SLURM_JOB_ID",
                Some("4x2".into()),
                "SLURM_JOB_ID is not a number",
            ),
            (
                "SLURM_JOB_UID",
                Some("-1".into()),
                "SLURM_JOB_UID is not a number",
            ),
            (
                "SLURM_JOB_UID",
                Some("99999999999".into()),
                "SLURM_JOB_UID is out of range",
            ),
            (
                "SLURM_JOB_USER",
                Some("a/../b".into()),
                "SLURM_JOB_USER is not a plain name",
            ),
            ("SLURMD_NODENAME", None, "SLURMD_NODENAME is missing"),
            ("SLURM_JOB_GID", None, "SLURM_JOB_GID is missing"),
            (
                "SPANK_TENANCY_TENANT",
                Some(OsString::from_vec(vec![0xff, 0xfe])),
                "SPANK_TENANCY_TENANT is not valid UTF-8",
            ),
            (
                "SPANK_TENANCY_MIG",
                Some("x".repeat(10_000).into()),
                "SPANK_TENANCY_MIG is 10000 bytes long",
            ),
            (
                "SPANK_TENANCY_TENANT",
                Some("acme\nevil".into()),
                "SPANK_TENANCY_TENANT contains control characters",
            ),
            (
                "SLURM_JOB_ACCOUNT",
                Some("a;rm -rf /".into()),
                "SLURM_JOB_ACCOUNT is not a plain name",
            ),
            (
                "SLURM_JOB_GPUS",
                Some("0,x".into()),
                "SLURM_JOB_GPUS is not a list",
            ),
        ];
        for (name, value, want) in cases {
            let e = with(name, value).unwrap_err();
            assert!(
                e.to_string().starts_with(want),
                "{name}: got '{e}', want '{want}'"
            );
        }
        // What could be read is kept for the denial record.
        let e = with("SLURM_JOB_UID", Some("abc".into())).unwrap_err();
        assert_eq!((e.job_id, e.user.as_deref()), (Some(42), Some("alice")));
    }
}
