//! Bad-input campaign (issue 9's, extended) over what job_submit/tenancy reads from a
//! submission: the job's uid, its account and its SPANK job environment, with the prolog as the
//! oracle. A job the plugin accepts is handed to a real prolog (`Spine::prolog`, the same code as
//! tenancy-prolog, with no layers) in the environment slurmd builds for it: the prolog must run
//! it. Nothing may panic. Since a refusal on the node drains the node, any input the plugin
//! takes and the prolog refuses is a way for a user to drain nodes.
//!
//! `TENANCY_FUZZ_SCALE=N` multiplies the input count.

use job_submit_tenancy::{decide_with, Submission, JOB_SHARED_NONE, JOB_SHARED_OK, NO_VAL16};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, TestRunner};
use std::cell::Cell;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::time::Instant;
use tenancy_config::{Config, Identity};
use tenancy_job::JobContext;
use tenancy_node::Spine;
use tenancy_test_support::{fuzz_cases, TenancyToml};

/// Tenants the test's users do and do not belong to: root is in acme (group root), daemon in
/// lab (its primary group daemon; a tier that shares no node), nobody in none.
fn config(dir: &Path) -> Config {
    let mut text = TenancyToml::under("fuzz", dir);
    text.tier("internal").mig_profiles(["1g.18gb", "3g.71gb"]);
    text.tier("restricted")
        .mig_profiles(["1g.18gb"])
        .share_gpu(false)
        .share_node(false);
    for (tenant, tier, group, accounts) in [
        ("acme", "internal", "root", &["acme-a", "acme.b"][..]),
        ("lab", "restricted", "daemon", &["lab"]),
        (
            "ghost",
            "internal",
            "tenancy-fuzz-no-such-group",
            &["ghost"],
        ),
    ] {
        text.tenant(tenant)
            .tier(tier)
            .groups([group])
            .accounts(accounts);
    }
    let text = text.to_string();
    Config::parse(&text, &dir.join("tenancy.toml")).expect("fuzz config")
}

fn bytes_of(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

/// Account values: names Slurm takes, near misses, and hostile bytes.
fn account() -> impl Strategy<Value = Option<Vec<u8>>> {
    let named = prop_oneof![
        Just("acme-a"),
        Just("ACME-A"),
        Just("acme.b"),
        Just("acme.b$"),
        Just("lab"),
        Just("ghost"),
        Just("bad acct"),
        Just("-lead"),
        Just(".dot"),
        Just("a/b"),
        Just("a;rm -rf /"),
        Just("jdoe@example.org"),
        Just(""),
        Just("é"),
    ]
    .prop_map(bytes_of);
    prop_oneof![
        3 => Just(None),
        4 => named.prop_map(Some),
        1 => (1usize..300).prop_map(|n| Some(vec![b'a'; n])),
        1 => "[a-zA-Z0-9_.$@ -]{0,40}".prop_map(|s| Some(s.into_bytes())),
        1 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(|v| {
            Some(v.into_iter().filter(|&b| b != 0).collect())
        }),
    ]
}

/// One SPANK job environment entry, under either spelling clients and slurmd use.
fn entry() -> impl Strategy<Value = Vec<u8>> {
    let name = prop_oneof![
        Just("SPANK_TENANCY_TENANT"),
        Just("TENANCY_TENANT"),
        Just("SPANK_TENANCY_MIG"),
        Just("TENANCY_MIG"),
        Just("SPANK_OTHER"),
        Just("SPANK_TENANCY_TENANTX"),
    ];
    let value = prop_oneof![
        Just(bytes_of("acme")),
        Just(bytes_of("lab")),
        Just(bytes_of("ghost")),
        Just(bytes_of("nope")),
        Just(bytes_of("ACME")),
        Just(bytes_of("../etc")),
        Just(bytes_of("1g.18gb")),
        Just(bytes_of("3g.71gb")),
        Just(bytes_of("7g.141gb")),
        Just(bytes_of("1g.18gb+me")),
        Just(bytes_of("")),
        Just(bytes_of("acme\nlab")),
        Just(vec![0xff, 0xfe]),
        (4000usize..4200).prop_map(|n| vec![b'a'; n]),
        "[a-z0-9._+-]{0,12}".prop_map(String::into_bytes),
        ".{0,8}".prop_map(String::into_bytes),
    ];
    prop_oneof![
        8 => (name, value).prop_map(|(n, v)| {
            let mut e = n.as_bytes().to_vec();
            e.push(b'=');
            e.extend(v.into_iter().filter(|&b| b != 0));
            e
        }),
        1 => Just(bytes_of("SPANK_TENANCY_TENANT")),
    ]
}

#[derive(Debug, Clone)]
struct Input {
    uid: u32,
    account: Option<Vec<u8>>,
    env: Vec<Vec<u8>>,
    shared: u16,
}

fn input() -> impl Strategy<Value = Input> {
    (
        prop_oneof![
            4 => Just(0u32),
            3 => Just(1),
            1 => Just(2),
            1 => Just(65534),
            1 => Just(3_999_999)
        ],
        account(),
        proptest::collection::vec(entry(), 0..4),
        prop_oneof![
            Just(NO_VAL16),
            Just(JOB_SHARED_NONE),
            Just(JOB_SHARED_OK),
            Just(2u16),
            Just(3)
        ],
    )
        .prop_map(|(uid, account, env, shared)| Input {
            uid,
            account,
            env,
            shared,
        })
}

/// The environment slurmd gives the prolog for an accepted job: the job's user and group from
/// its uid, the account as slurmctld stores it (lowercased), the SPANK job environment with
/// `SPANK_` before every name that lacks it.
fn prolog_env(
    job: u64,
    s: &Submission,
    who: &Identity,
    env: &[Vec<u8>],
) -> Vec<(OsString, OsString)> {
    let mut v: Vec<(OsString, OsString)> = [
        ("SLURM_JOB_ID", job.to_string()),
        ("SLURM_JOB_UID", s.uid.to_string()),
        ("SLURM_JOB_GID", who.gid.to_string()),
        ("SLURM_JOB_USER", who.user.clone()),
        ("SLURMD_NODENAME", "node1".into()),
        ("SLURM_CLUSTER_NAME", "fuzz".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into()))
    .collect();
    if let Some(a) = &s.account {
        v.push(("SLURM_JOB_ACCOUNT".into(), a.into()));
    }
    for e in env {
        let Some(eq) = e.iter().position(|&b| b == b'=') else {
            continue;
        };
        let name = String::from_utf8_lossy(&e[..eq]).into_owned();
        let name = if name.starts_with("SPANK_") {
            name
        } else {
            format!("SPANK_{name}")
        };
        v.retain(|(k, _)| *k != *name);
        v.push((name.into(), OsString::from_vec(e[eq + 1..].to_vec())));
    }
    v
}

#[test]
fn job_submit_parity() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let n = fuzz_cases(512);
    let t0 = Instant::now();
    let (count, accepted) = (Cell::new(0u64), Cell::new(0u64));
    let job = Cell::new(1000u64);
    let mut runner = TestRunner::new(PtConfig {
        cases: n,
        failure_persistence: None,
        ..PtConfig::default()
    });
    let r = runner.run(&input(), |i| {
        count.set(count.get() + 1);
        let env: Vec<&[u8]> = i.env.iter().map(Vec::as_slice).collect();
        let submission = Submission::from_parts(i.uid, i.account.as_deref(), &env).map(|mut s| {
            s.shared = i.shared;
            s
        });
        let Ok(s) = submission else {
            return Ok(());
        };
        let Ok(verdict) = decide_with(&s, &config) else {
            return Ok(());
        };
        accepted.set(accepted.get() + 1);
        // slurmctld places the job as the plugin set it (exclusive where a tier rule needs it),
        // so the prolog meets no other tenant's job on the node: none runs here.
        let who = Identity::from_uid(i.uid).expect("an accepted job's user exists");
        job.set(job.get() + 1);
        let vars = prolog_env(job.get(), &s, &who, &i.env);
        let mut spine = Spine::new(&config, vec![], "tenancy-prolog").unwrap();
        let end = spine.prolog(JobContext::from_vars(vars.clone()));
        prop_assert_eq!(
            end.code,
            0,
            "accepted by job_submit/tenancy ({:?}) but refused by the prolog: {}; env {:?}",
            verdict,
            end.message,
            vars
        );
        let ctx = JobContext::from_vars(vars).unwrap();
        prop_assert_eq!(spine.epilog(&ctx).code, 0);
        Ok(())
    });
    eprintln!(
        "FIGURES job_submit_parity: {} inputs ({} accepted) in {:.2?}",
        count.get(),
        accepted.get(),
        t0.elapsed()
    );
    if let Err(e) = r {
        panic!("job_submit_parity: {e}");
    }
    assert!(
        accepted.get() > 0,
        "no input was accepted: the campaign proved nothing"
    );
}
