//! `tenancyctl adopt` (pam_exec after pam_slurm_adopt): a session process in a Slurm job's
//! cgroup joins the job's isolation as a task does, or is refused. Root only: it moves real
//! processes between real cgroup2 directories.

mod common;

use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use tenancy_job::{Journal, JournalDir, Step, StepState};
use tenancy_test_support::{output_text, requires_root};

fn cgroup2_root() -> PathBuf {
    tenancy_devices::CgroupLayout::detect()
        .unwrap()
        .v2_root
        .expect("cgroup2 mounted")
}

/// cgroup directories made for the test, removed (deepest first) with their processes gone.
struct Tree {
    dirs: Vec<PathBuf>,
    children: Vec<Child>,
}

impl Tree {
    fn mkdir(&mut self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        let mut d = dir.to_path_buf();
        // Every level up to the mount goes at the end (a level other tests still use is not
        // empty then, and stays).
        while !self.dirs.contains(&d) && d != cgroup2_root() && d.parent().is_some() {
            self.dirs.push(d.clone());
            d = d.parent().unwrap().to_path_buf();
        }
    }

    /// A `sleep` placed in `dir` (as pam_slurm_adopt places the sshd session in the job).
    fn process_in(&mut self, dir: &Path) -> i32 {
        self.mkdir(dir);
        let child = Command::new("sleep").arg("60").spawn().unwrap();
        let pid = child.id() as i32;
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        self.children.push(child);
        pid
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.dirs
            .sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The process's cgroup2 path (the `0::` line), relative to the cgroup2 mount.
fn cgroup_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(String::from))
        .unwrap()
}

fn rel(dir: &Path) -> String {
    format!("/{}", dir.strip_prefix(cgroup2_root()).unwrap().display())
}

fn adopt(config: &Path, pid: i32, user: &str, pam_type: &str) -> Output {
    adopt_claiming(config, pid, user, pam_type, None)
}

/// `tenancyctl adopt` with SLURM_JOB_ID in its environment, as pam_slurm_adopt leaves it.
fn adopt_claiming(
    config: &Path,
    pid: i32,
    user: &str,
    pam_type: &str,
    claimed: Option<u64>,
) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tenancyctl"));
    c.args(["--config", config.to_str().unwrap(), "adopt", "--pid"])
        .arg(pid.to_string())
        .args(["--user", user])
        .env("PAM_TYPE", pam_type)
        .env_remove("SLURM_JOB_ID");
    if let Some(j) = claimed {
        c.env("SLURM_JOB_ID", j.to_string());
    }
    c.output().unwrap()
}

/// Runs tenancyctl with exactly `args` and `env`, in that order and duplicates included, as
/// pam_exec does (the PAM environment, then its own PAM_USER, PAM_TYPE, ...), which
/// `Command` cannot (it keeps one value per name). Returns the exit status.
fn tenancyctl_with_raw_env(args: &[&str], env: &[(&str, &str)]) -> i32 {
    use std::ffi::CString;
    let bin = CString::new(env!("CARGO_BIN_EXE_tenancyctl")).unwrap();
    let argv: Vec<CString> = std::iter::once("tenancyctl")
        .chain(args.iter().copied())
        .map(|a| CString::new(a).unwrap())
        .collect();
    let envp: Vec<CString> = env
        .iter()
        .map(|(k, v)| CString::new(format!("{k}={v}")).unwrap())
        .collect();
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut envp_p: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    envp_p.push(std::ptr::null());
    // SAFETY: everything the child touches is built before the fork; it only calls execve
    // and _exit, both async-signal-safe.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            libc::execve(bin.as_ptr(), argv_p.as_ptr(), envp_p.as_ptr());
            libc::_exit(127);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status), "tenancyctl: wait status {status}");
        libc::WEXITSTATUS(status)
    }
}

/// A job as the prolog leaves it on this node: its journal (one layer whose cgroup a task
/// joins), its product cgroup, and where Slurm keeps its extern steps.
struct JobFixture {
    dir: tempfile::TempDir,
    config: PathBuf,
    job: u64,
    product: PathBuf,
    tag: String,
    tree: Tree,
}

impl JobFixture {
    /// `name` keeps the cgroups of tests running side by side apart.
    fn new(name: &str, first_job: u64) -> JobFixture {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        std::fs::create_dir(r.join("scratch")).unwrap();
        let config = common::minimal_config(r);
        let tag = format!("{name}{}", std::process::id());
        let job: u64 = first_job + u64::from(std::process::id() % 100_000);
        let product = cgroup2_root()
            .join("tenancy")
            .join(&tag)
            .join(format!("job_{job}"));
        let mut tree = Tree {
            dirs: Vec::new(),
            children: Vec::new(),
        };
        tree.mkdir(&product);
        let journal = Journal {
            steps: vec![Step {
                layer: "devices".into(),
                state: StepState::Made,
                intent: json!({ "job_id": job }),
                made: Some(json!({ "join_cgroups": [product] })),
            }],
            ..tenancy_test_support::journals::journal(job, "t", "root", 0)
        };
        JournalDir::open(&r.join("state"))
            .unwrap()
            .save(&journal, true)
            .unwrap();
        JobFixture {
            dir,
            config,
            job,
            product,
            tag,
            tree,
        }
    }

    /// Job `j`'s extern step cgroup, where pam_slurm_adopt puts an ssh session.
    fn extern_step(&self, j: u64) -> PathBuf {
        cgroup2_root().join(format!("{}-slurm/uid_0/job_{j}/step_extern", self.tag))
    }
}

#[test]
fn a_session_in_a_job_joins_its_isolation_or_is_refused() {
    if !requires_root(
        "a_session_in_a_job_joins_its_isolation_or_is_refused: moves processes between cgroups",
    ) {
        return;
    }
    let mut f = JobFixture::new("adopt", 4_200_000);
    let (r, config, job) = (f.dir.path().to_path_buf(), f.config.clone(), f.job);
    let product = f.product.clone();
    let root = cgroup2_root();

    // Another user's session in the job: refused, and left where it was.
    let pid = f.tree.process_in(&f.extern_step(job));
    let o = adopt(&config, pid, "daemon", "open_session");
    assert_eq!(o.status.code(), Some(1), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("belongs to uid 0"),
        "{}",
        output_text(&o)
    );
    assert_eq!(cgroup_of(pid), rel(&f.extern_step(job)));
    // At close_session nothing is done.
    let o = adopt(&config, pid, "root", "close_session");
    assert_eq!(o.status.code(), Some(0), "{}", output_text(&o));
    assert_eq!(cgroup_of(pid), rel(&f.extern_step(job)));
    // pam_slurm_adopt's claim (SLURM_JOB_ID) must match the job the process is in.
    let o = adopt_claiming(&config, pid, "root", "open_session", Some(job + 7));
    assert_eq!(o.status.code(), Some(1), "{}", output_text(&o));
    assert!(
        output_text(&o).contains(&format!("is in job {job}'s cgroup")),
        "{}",
        output_text(&o)
    );
    assert_eq!(cgroup_of(pid), rel(&f.extern_step(job)));
    // The job's own user: the session now runs in the job's isolation.
    let o = adopt_claiming(&config, pid, "root", "open_session", Some(job));
    assert_eq!(o.status.code(), Some(0), "{}", output_text(&o));
    assert!(
        output_text(&o).contains(&format!("joined the isolation of job {job} (tenant acme)")),
        "{}",
        output_text(&o)
    );
    assert_eq!(cgroup_of(pid), rel(&product));

    // A job the prolog did not set up here (no journal): refused, never unisolated.
    let other = f.tree.process_in(&f.extern_step(job + 1));
    let o = adopt(&config, other, "root", "open_session");
    assert_eq!(o.status.code(), Some(1), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("no journal"),
        "{}",
        output_text(&o)
    );
    assert_eq!(cgroup_of(other), rel(&f.extern_step(job + 1)));

    // A login in no job (pam_slurm_adopt let it through): nothing to isolate, left alone.
    let plain = root.join(format!("{}-slurm/plain", f.tag));
    let login = f.tree.process_in(&plain);
    let o = adopt(&config, login, "root", "open_session");
    assert_eq!(o.status.code(), Some(0), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("in no Slurm job"),
        "{}",
        output_text(&o)
    );
    assert_eq!(cgroup_of(login), rel(&plain));
    // ... unless pam_slurm_adopt says it adopted it into a job: then something is off, refused.
    let o = adopt_claiming(&config, login, "root", "open_session", Some(job));
    assert_eq!(o.status.code(), Some(1), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("in no job's cgroup"),
        "{}",
        output_text(&o)
    );
    assert_eq!(cgroup_of(login), rel(&plain));

    // The audit log tells the adopted session from the refused ones, and its chain holds.
    let events: Vec<(String, Option<u64>)> = std::fs::read_to_string(r.join("audit.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["event"].as_str().unwrap().to_string(),
                v["job_id"].as_u64(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            ("session_refused".to_string(), Some(job)),
            ("session_refused".to_string(), Some(job + 7)),
            ("session_adopted".to_string(), Some(job)),
            ("session_refused".to_string(), Some(job + 1)),
            ("session_refused".to_string(), Some(job)),
        ]
    );
    let verify = Command::new(env!("CARGO_BIN_EXE_tenancyctl"))
        .args(["audit", "verify"])
        .arg(r.join("audit.jsonl"))
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", output_text(&verify));
}

/// pam_exec hands `tenancyctl adopt` the PAM environment, which the session's user can write to
/// (`~/.pam_environment` through `pam_env.so user_readenv=1`), before its own variables. A
/// PAM_TYPE or PAM_USER put there first must not make adopt skip the session (a session left
/// outside the job's device allowlist and firewall), and a TENANCY_CONFIG there must not make
/// adopt read a config the user wrote (with its journals and audit log where they like).
#[test]
fn a_users_pam_environment_cannot_steer_adopt() {
    if !requires_root("a_users_pam_environment_cannot_steer_adopt: moves processes between cgroups")
    {
        return;
    }
    let mut f = JobFixture::new("adoptenv", 4_300_000);
    let (config, job) = (f.config.to_str().unwrap().to_string(), f.job);
    let pid = f.tree.process_in(&f.extern_step(job));
    let pid_s = pid.to_string();
    // What the user put in the PAM environment first, then what pam_exec appends.
    let user_first = [
        ("PAM_TYPE", "close_session"),
        ("PAM_USER", "daemon"),
        ("SLURM_JOB_ID", &job.to_string()),
    ];
    let pam_exec = [("PAM_USER", "root"), ("PAM_TYPE", "open_session")];
    let env: Vec<(&str, &str)> = user_first.iter().chain(&pam_exec).copied().collect();
    let status = tenancyctl_with_raw_env(&["--config", &config, "adopt", "--pid", &pid_s], &env);
    assert_eq!(status, 0);
    assert_eq!(
        cgroup_of(pid),
        rel(&f.product),
        "the session was not moved into job {job}'s isolation"
    );

    // A second session in the job, its config named through the PAM environment (no
    // --config) by the user: a copy the user owns (or could write) is not used, the session is
    // refused and stays where pam_slurm_adopt put it.
    let second = f.tree.process_in(&f.extern_step(job));
    let second_s = second.to_string();
    let users_copy = f.dir.path().join("mine.toml");
    std::fs::copy(&config, &users_copy).unwrap();
    std::os::unix::fs::chown(&users_copy, Some(65534), Some(65534)).unwrap();
    let named = |path: &str| -> Vec<(String, String)> {
        [("TENANCY_CONFIG", path)]
            .iter()
            .chain(&pam_exec)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let env = named(users_copy.to_str().unwrap());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let status = tenancyctl_with_raw_env(&["adopt", "--pid", &second_s], &env);
    assert_ne!(status, 0, "adopt used a config its user owns");
    assert_eq!(cgroup_of(second), rel(&f.extern_step(job)));
    // The admin's config (root's alone) named the same way is used.
    let env = named(&config);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let status = tenancyctl_with_raw_env(&["adopt", "--pid", &second_s], &env);
    assert_eq!(status, 0);
    assert_eq!(cgroup_of(second), rel(&f.product));
}
