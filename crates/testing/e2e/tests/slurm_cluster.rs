//! End-to-end on a real single-node Slurm cluster (needs root; skips loudly otherwise).
//! Scenarios share the machine-wide cluster lock, so they run one after the other.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;
use tenancy_e2e::{
    artifact, scenario, submitted_id, Cluster, ClusterOptions, Options, TenancyToml, Users,
};

fn uniq(prefix: &str) -> String {
    // Short: user and group names are limited to 32 characters.
    format!("{prefix}{}", std::process::id() % 100000)
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Tenants acme and globex whose members are the given unique groups.
fn tenancy_toml(root: &std::path::Path, acme_group: &str, globex_group: &str) -> String {
    let mut c = TenancyToml::new("e2e");
    c.cluster()
        .state_dir(root.join("tenancy-state"))
        .audit_log(root.join("audit.jsonl"))
        .scratch_root(root.join("scratch"));
    c.tier("research").mig_profiles(["1g.18gb", "2g.35gb"]);
    for (tenant, group) in [("acme", acme_group), ("globex", globex_group)] {
        c.tenant(tenant)
            .tier("research")
            .groups([group])
            .accounts([format!("{tenant}-acct")]);
    }
    c.to_string()
}

scenario!(
    cluster_comes_up_runs_a_job_and_goes_down,
    Options::host(),
    |cluster: &mut Cluster| {
        assert_eq!(cluster.node_state().unwrap(), "idle");
        let mut c = cluster.cmd("sbatch");
        let out_file = cluster.path("jobs/hello.out");
        c.args([
            "--output",
            out_file.to_str().unwrap(),
            "--wrap",
            "echo hello-from-slurm; /bin/date +%s.%N",
        ]);
        let submitted = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let out = cluster.run(c).unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let id = submitted_id(&out).unwrap();
        let info = cluster.wait_job_done(id, Duration::from_secs(30)).unwrap();
        assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
        let text = fs::read_to_string(&out_file).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("hello-from-slurm"));
        let started: f64 = lines.next().unwrap().parse().unwrap();
        eprintln!(
            "baseline (plain Slurm, no product): submit to user code {:.0} ms",
            (started - submitted) * 1000.0
        );

        let conf = cluster.conf.clone();
        cluster.stop().unwrap();
        // No daemon of ours survives: nothing answers on this SLURM_CONF, and no process carries it.
        let mut s = std::process::Command::new("sinfo");
        s.env("SLURM_CONF", &conf).args(["-h"]);
        let o = s.output().unwrap();
        assert!(
            !o.status.success(),
            "slurmctld still answers: {}",
            stdout(&o)
        );
        let marker = format!("SLURM_CONF={}", conf.display());
        for e in fs::read_dir("/proc").unwrap().flatten() {
            let env = fs::read(e.path().join("environ")).unwrap_or_default();
            let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
            if cmd.starts_with(b"slurm") {
                assert!(
                    !env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()),
                    "leftover process {:?}",
                    String::from_utf8_lossy(&cmd)
                );
            }
        }
        cluster.stop().unwrap(); // idempotent
    }
);

scenario!(
    plugin_options_refusals_and_handoff_to_prolog,
    Options::host(),
    |users: &mut Users| {
        let so = artifact("libspank_tenancy.so").expect("plugin");
        let ga = uniq("tacme");
        let gg = uniq("tglobex");
        users.group(&ga).unwrap();
        users.group(&gg).unwrap();
        let acme1 = users.user(&uniq("acme1u"), &[&ga]).unwrap();
        let nobody = users.user(&uniq("none1u"), &[]).unwrap();
        let both = users.user(&uniq("both1u"), &[&ga, &gg]).unwrap();

        // A Prolog that records its environment (it has no PATH: absolute paths only), so the
        // hand-off through spank_job_control_setenv is observed where the real prolog reads it.
        let base = std::env::temp_dir().join(format!("tenancy-e2e-prolog-{}", std::process::id()));
        fs::create_dir_all(&base).unwrap();
        let prolog = base.join("prolog.sh");
        fs::write(&prolog, include_str!("../scripts/record-env-prolog.sh")).unwrap();
        fs::set_permissions(&prolog, fs::Permissions::from_mode(0o755)).unwrap();
        let state_root: PathBuf = base.clone();
        let cluster = Cluster::start(ClusterOptions {
            prolog: Some(prolog.clone()),
            spank_plugin: Some(so),
            tenancy_toml: Some(tenancy_toml(&state_root, &ga, &gg)),
            ..Default::default()
        })
        .expect("cluster");

        // Options listed in --help of all three clients.
        for client in ["sbatch", "srun", "salloc"] {
            let mut c = cluster.cmd_as(&acme1, client);
            c.arg("--help");
            let o = cluster.run(c).unwrap();
            let text = stdout(&o);
            assert!(text.contains("--tenant=name"), "{client} --help: {text}");
            assert!(text.contains("--mig=profile"), "{client} --help: {text}");
        }

        // Refused: not a member. One line from the plugin, no job created.
        let refuse = |user: &tenancy_e2e::TestUser, args: &[&str], expect: &str| {
            let mut c = cluster.cmd_as(user, "sbatch");
            c.args(args).args(["--wrap", "true"]);
            let o = cluster.run(c).unwrap();
            assert!(
                !o.status.success(),
                "sbatch {args:?} as {} was accepted",
                user.name
            );
            let err = stderr(&o);
            let ours: Vec<&str> = err.lines().filter(|l| l.contains("tenancy: ")).collect();
            assert_eq!(ours.len(), 1, "expected one tenancy line, got: {err}");
            assert!(ours[0].contains(expect), "wanted {expect:?} in {err}");
            eprintln!("refused as expected: {}", err.trim());
        };
        refuse(
            &acme1,
            &["--tenant=globex"],
            &format!(
                "tenancy: user {} is not a member of tenant 'globex' (members need group {gg})",
                acme1.name
            ),
        );
        refuse(
            &nobody,
            &[],
            &format!("user {} is not a member of any tenant", nobody.name),
        );
        refuse(
            &both,
            &[],
            "is a member of several tenants (acme, globex): choose one with --tenant",
        );
        refuse(
            &acme1,
            &["--tenant=acme", "--mig=7g.141gb"],
            "MIG profile '7g.141gb' is not allowed for tenant 'acme'",
        );
        refuse(&acme1, &["--tenant=initech"], "unknown tenant 'initech'");
        refuse(
            &acme1,
            &["--tenant=acme", "--account=globex-acct"],
            "account 'globex-acct' belongs to tenant 'globex'",
        );
        // srun and salloc refuse the same way.
        for client in ["srun", "salloc"] {
            let mut c = cluster.cmd_as(&acme1, client);
            c.args(["--tenant=globex", "/bin/true"]);
            let o = cluster.run(c).unwrap();
            assert!(!o.status.success());
            assert!(
                stderr(&o).contains("is not a member of tenant 'globex'"),
                "{client}: {}",
                stderr(&o)
            );
        }
        let mut q = cluster.cmd("squeue");
        q.args(["-h", "-o", "%i"]);
        assert_eq!(
            stdout(&cluster.run(q).unwrap()).trim(),
            "",
            "a refused submit created a job"
        );

        // Accepted, with #SBATCH lines: the choice reaches the Prolog.
        let script = cluster.user_dir(&acme1).join("job.sh");
        fs::write(
            &script,
            include_str!("../scripts/jobs/tenant-by-sbatch-lines.sh"),
        )
        .unwrap();
        let mut c = cluster.cmd_as(&acme1, "sbatch");
        c.arg(&script);
        let o = cluster.run(c).unwrap();
        assert!(o.status.success(), "accepted submit failed: {}", stderr(&o));
        let id = submitted_id(&o).unwrap();
        let info = cluster.wait_job_done(id, Duration::from_secs(30)).unwrap();
        // This Prolog wrote no journal: the task side fails closed. The step fails with the
        // plugin's message before the script runs; slurmstepd survives and the node stays up.
        assert_eq!(info["JobState"], "FAILED", "{info:?}");
        let out =
            fs::read_to_string(cluster.user_dir(&acme1).join(format!("slurm-{id}.out"))).unwrap();
        assert!(
            out.contains(&format!(
                "tenancy: job {id}: cannot put the task into its isolation"
            )),
            "{out}"
        );
        assert!(!out.lines().any(|l| l == "ran"), "user code ran: {out}");
        assert_eq!(cluster.node_state().unwrap(), "idle");
        let env = fs::read_to_string(base.join(format!("prolog-env.{id}"))).expect("prolog ran");
        assert!(
            env.lines().any(|l| l == "SPANK_TENANCY_TENANT=acme"),
            "{env}"
        );
        assert!(
            env.lines().any(|l| l == "SPANK_TENANCY_MIG=1g.18gb"),
            "{env}"
        );

        // A member of both tenants picks one explicitly.
        let mut c = cluster.cmd_as(&both, "sbatch");
        c.args(["--tenant=globex", "--wrap", "true"]);
        let o = cluster.run(c).unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let id = submitted_id(&o).unwrap();
        let _ = cluster.wait_job_done(id, Duration::from_secs(30));
        let env = fs::read_to_string(base.join(format!("prolog-env.{id}"))).expect("prolog ran");
        assert!(
            env.lines().any(|l| l == "SPANK_TENANCY_TENANT=globex"),
            "{env}"
        );
        assert!(!env.contains("SPANK_TENANCY_MIG"), "{env}");
        drop(cluster);
        let _ = fs::remove_dir_all(&base);
    }
);
