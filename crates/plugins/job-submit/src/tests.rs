use super::*;
use crate::slurmctld::symbol;
use std::ffi::CStr;
use tenancy_test_support::{GpuPlacement as TestPlacement, ScratchOnExit, TenancyToml};

/// A config with a tenant the test's user is a member of (through its primary group) and one
/// it is not (a group NSS does not know).
fn config() -> (tempfile::TempDir, PathBuf, Config) {
    let me = Identity::from_uid(rustix_uid()).expect("the test's own user");
    let group = nix_group_name(me.gid);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenancy.toml");
    let mut text = TenancyToml::under("t", dir.path());
    text.tier("internal")
        .mig_profiles(["1g.18gb"])
        .share_gpu(true)
        .share_node(true)
        .scratch_on_exit(ScratchOnExit::Wipe);
    text.tenant("mine")
        .tier("internal")
        .groups([&group])
        .accounts(["mine-acct"]);
    text.tenant("other")
        .tier("internal")
        .groups(["tenancy-no-such-group"])
        .accounts(["other-acct"]);
    let text = text.to_string();
    std::fs::write(&path, &text).unwrap();
    let config = Config::parse(&text, &path).expect("valid test config");
    (dir, path, config)
}

fn rustix_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

fn nix_group_name(gid: u32) -> String {
    // SAFETY: getgrgid returns a pointer into static storage or null; read at once.
    unsafe {
        let g = libc::getgrgid(gid);
        assert!(
            !g.is_null(),
            "the test user's primary group {gid} has no name"
        );
        CStr::from_ptr((*g).gr_name).to_string_lossy().into_owned()
    }
}

fn submission(env: &[&str], account: Option<&str>) -> Result<Submission, String> {
    let env: Vec<&[u8]> = env.iter().map(|e| e.as_bytes()).collect();
    Submission::from_parts(rustix_uid(), account.map(str::as_bytes), &env)
}

#[test]
fn reads_what_the_prolog_reads_from_the_spank_environment() {
    let s = submission(
        &[
            "SPANK_OTHER=x",
            "SPANK_TENANCY_TENANTX=no",
            "SPANK_TENANCY_TENANT=mine",
            "SPANK_TENANCY_MIG=1g.18gb",
        ],
        Some("Mine-Acct"),
    )
    .unwrap();
    assert_eq!(s.tenant.as_deref(), Some("mine"));
    assert_eq!(s.mig.as_deref(), Some("1g.18gb"));
    // slurmctld lowercases the account after the job_submit plugins, and the prolog sees that.
    assert_eq!(s.account.as_deref(), Some("mine-acct"));
    // Empty values are absent, as in the prolog; the same value twice is one value.
    let s = submission(
        &[
            "SPANK_TENANCY_TENANT=",
            "SPANK_TENANCY_MIG=a",
            "SPANK_TENANCY_MIG=a",
        ],
        Some(""),
    )
    .unwrap();
    assert_eq!(
        (s.tenant, s.mig.as_deref(), s.account),
        (None, Some("a"), None)
    );
}

#[test]
fn refuses_what_the_prolog_could_not_read() {
    let twice = submission(
        &["SPANK_TENANCY_TENANT=mine", "SPANK_TENANCY_TENANT=other"],
        None,
    );
    assert!(twice
        .unwrap_err()
        .contains("SPANK_TENANCY_TENANT is given twice"));
    // The two spellings slurmd merges into one variable of the prolog.
    let both = submission(&["TENANCY_TENANT=mine", "SPANK_TENANCY_TENANT=other"], None);
    assert!(both.unwrap_err().contains("given twice"));
    let control = submission(&["SPANK_TENANCY_TENANT=mine\nother"], None);
    assert!(control.unwrap_err().contains("control characters"));
    let bad = Submission::from_parts(0, None, &[b"SPANK_TENANCY_MIG=\xff"]);
    assert!(bad
        .unwrap_err()
        .contains("SPANK_TENANCY_MIG is not valid UTF-8"));
    let long = format!("SPANK_TENANCY_TENANT={}", "a".repeat(MAX_VALUE + 1));
    assert!(submission(&[&long], None)
        .unwrap_err()
        .contains("bytes long"));
}

/// `SLURM_GET_USER_ENV=1` in the job's environment (whoever put it there) is refused
/// unless the tenant's tier allows it; a look-alike value is not the request.
#[test]
fn a_login_environment_is_refused_unless_the_tier_allows_it() {
    let (_dir, path, config) = config();
    let job = |env: &[&str]| {
        let env: Vec<&[u8]> = env.iter().map(|e| e.as_bytes()).collect();
        submission(&["SPANK_TENANCY_TENANT=mine"], None)
            .unwrap()
            .with_job_environment(&env)
    };
    let asked = job(&["PATH=/bin", "SLURM_GET_USER_ENV=1"]);
    assert!(asked.get_user_env);
    let why = asked.check(&config).unwrap_err();
    assert!(
        why.contains("--get-user-env") && why.contains("tier 'internal'"),
        "{why}"
    );
    for other in [
        &["SLURM_GET_USER_ENV=0"][..],
        &["SLURM_GET_USER_ENV=1x"],
        &[],
    ] {
        assert!(!job(other).get_user_env, "{other:?}");
        job(other).check(&config).unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "scratch_on_exit = \"wipe\"\n",
        "scratch_on_exit = \"wipe\"\nallow_get_user_env = true\n",
    );
    let allowing = Config::parse(&text, &path).unwrap();
    assert!(allowing.tiers["internal"].allow_get_user_env);
    job(&["SLURM_GET_USER_ENV=1"]).check(&allowing).unwrap();
}

#[test]
fn takes_the_prologs_decision() {
    let (_dir, _path, config) = config();
    let check =
        |env: &[&str], account: Option<&str>| submission(env, account).unwrap().check(&config);
    let ok = check(
        &["SPANK_TENANCY_TENANT=mine", "SPANK_TENANCY_MIG=1g.18gb"],
        Some("mine-acct"),
    )
    .unwrap();
    assert_eq!(
        (ok.tenant.as_str(), ok.profile.as_deref()),
        ("mine", Some("1g.18gb"))
    );
    // No --tenant: the one tenant the user is a member of.
    assert_eq!(check(&[], None).unwrap().tenant, "mine");
    let not_member = check(&["SPANK_TENANCY_TENANT=other"], None).unwrap_err();
    assert!(
        not_member.contains("not a member of tenant 'other'"),
        "{not_member}"
    );
    let unknown = check(&["SPANK_TENANCY_TENANT=nope"], None).unwrap_err();
    assert!(unknown.contains("nope"), "{unknown}");
    let profile = check(
        &["SPANK_TENANCY_TENANT=mine", "SPANK_TENANCY_MIG=7g.141gb"],
        None,
    )
    .unwrap_err();
    assert!(profile.contains("7g.141gb"), "{profile}");
    let account = check(&["SPANK_TENANCY_TENANT=mine"], Some("OTHER-ACCT")).unwrap_err();
    assert!(
        account.contains("other-acct") && account.contains("other"),
        "{account}"
    );
}

#[test]
fn refuses_accounts_the_prolog_refuses_with_its_words() {
    let bad = submission(&[], Some("bad acct")).unwrap_err();
    assert!(
        bad.starts_with("SLURM_JOB_ACCOUNT is not a plain name: 'bad acct'"),
        "{bad}"
    );
    let long = submission(&[], Some(&"a".repeat(200))).unwrap_err();
    assert!(long.contains("200 bytes long (at most 128)"), "{long}");
    // What Slurm takes for an account, the prolog takes too.
    assert_eq!(
        submission(&[], Some("Acme.A$")).unwrap().account.as_deref(),
        Some("acme.a$")
    );
}

#[test]
fn tiers_that_share_no_node_or_gpu_get_a_node_of_their_own() {
    let mut text = TenancyToml::under("t", std::path::Path::new("/"));
    text.tier("open").mig_profiles(["1g.18gb"]);
    text.tier("alone").share_node(false);
    text.tier("gpu-alone")
        .mig_profiles(["1g.18gb"])
        .share_gpu(false);
    text.tier("gpu-packed")
        .mig_profiles(["1g.18gb"])
        .share_gpu(false)
        .gpu_placement(TestPlacement::Gpu);
    for (tenant, tier, group) in [
        ("a", "open", "root"),
        ("b", "alone", "daemon"),
        ("c", "gpu-alone", "bin"),
        ("d", "gpu-packed", "sys"),
    ] {
        text.tenant(tenant).tier(tier).groups([group]);
    }
    let text = text.to_string();
    let config = Config::parse(&text, std::path::Path::new("/t.toml")).unwrap();
    let r = |tenant: &str, tier: &str, profile: Option<&str>| Resolved {
        tenant: tenant.into(),
        tier: tier.into(),
        profile: profile.map(String::from),
        tenant_gid: Some(0),
    };
    let p = |res: &Resolved, shared| placement(&config, res, shared);
    assert_eq!(p(&r("a", "open", Some("1g.18gb")), NO_VAL16), Ok(false));
    assert_eq!(p(&r("b", "alone", None), NO_VAL16), Ok(true));
    assert_eq!(p(&r("b", "alone", None), 2), Ok(true));
    assert_eq!(p(&r("b", "alone", None), JOB_SHARED_NONE), Ok(false));
    let e = p(&r("b", "alone", None), JOB_SHARED_OK).unwrap_err();
    assert!(
        e.contains("share_node = false") && e.contains("--oversubscribe"),
        "{e}"
    );
    assert_eq!(p(&r("c", "gpu-alone", Some("1g.18gb")), NO_VAL16), Ok(true));
    assert_eq!(p(&r("c", "gpu-alone", None), NO_VAL16), Ok(false));
    assert!(p(&r("c", "gpu-alone", Some("1g.18gb")), JOB_SHARED_OK)
        .unwrap_err()
        .contains("share_gpu = false"));
    // Opted out: placed by the prolog on a GPU of its own, beside other tenants.
    assert_eq!(
        p(&r("d", "gpu-packed", Some("1g.18gb")), NO_VAL16),
        Ok(false)
    );
}

/// slurmrestd and libslurm jobs name the tenant in their own environment: taken only
/// when the SPANK job environment names none, checked the same way, and handed on to the
/// prolog in the SPANK job environment.
#[test]
fn a_job_without_the_spank_environment_names_its_tenant_in_its_environment() {
    let (_dir, _path, config) = config();
    let job = |spank: &[&str], env: &[&str]| {
        let env: Vec<&[u8]> = env.iter().map(|e| e.as_bytes()).collect();
        submission(spank, None).and_then(|s| s.with_request_from_environment(&env))
    };
    let rest = job(
        &[],
        &["PATH=/bin", "TENANCY_TENANT=mine", "TENANCY_MIG=1g.18gb"],
    )
    .unwrap();
    assert!(rest.from_job_env);
    let a = decide_with(&rest, &config).unwrap();
    assert_eq!(
        a.spank_env,
        [
            ("TENANCY_TENANT".to_string(), "mine".to_string()),
            ("TENANCY_MIG".to_string(), "1g.18gb".to_string())
        ]
    );
    // The same refusal, in the same words, as through sbatch.
    let refused = decide_with(&job(&[], &["TENANCY_TENANT=other"]).unwrap(), &config).unwrap_err();
    let via_sbatch = decide_with(
        &submission(&["SPANK_TENANCY_TENANT=other"], None).unwrap(),
        &config,
    )
    .unwrap_err();
    assert_eq!(refused, via_sbatch);
    // sbatch --tenant wins over a variable the user's shell exports.
    let both = job(&["SPANK_TENANCY_TENANT=mine"], &["TENANCY_TENANT=other"]).unwrap();
    assert!(!both.from_job_env);
    assert!(decide_with(&both, &config).unwrap().spank_env.is_empty());
    let twice = job(&[], &["TENANCY_TENANT=mine", "TENANCY_TENANT=other"]).unwrap_err();
    assert!(twice.contains("TENANCY_TENANT is given twice"), "{twice}");
    let bad = job(&[], &["TENANCY_TENANT=a\u{7}"]).unwrap_err();
    assert!(bad.contains("control characters"), "{bad}");
}

/// A scrontab job (always `SLURM_GET_USER_ENV=1`) is refused with a reason that names
/// scrontab unless the tier allows a login environment.
#[test]
fn a_scrontab_job_is_refused_with_its_reason() {
    let (_dir, _path, config) = config();
    let mut s = submission(&[], None)
        .unwrap()
        .with_job_environment(&[b"SLURM_GET_USER_ENV=1"]);
    s.cron = true;
    let why = decide_with(&s, &config).unwrap_err();
    assert!(
        why.starts_with("scrontab jobs ask for your login environment"),
        "{why}"
    );
}

const SLURM_CONF: &str = "ClusterName=t\nNodeName=n[1-4] CPUs=2\nMCSPlugin=mcs/label\n\
                          MCSParameters=ondemand,select\n";

fn pooled(extra: &str) -> (tenancy_config::slurm_conf::SlurmConf, Config) {
    let me = Identity::from_uid(rustix_uid()).unwrap();
    let text = format!(
        "[cluster]\nname = \"t\"\nstate_dir = \"/s\"\naudit_log = \"/a.jsonl\"\n\
         scratch_root = \"/scratch\"\n[tiers.open]\n[tiers.own]\nnodes = \"n[3-4]\"\n\
         share_node = false\n{extra}\n[tenants.mine]\ntier = \"own\"\ngroups = [\"{}\"]\n\
         accounts = [\"mine-acct\"]\n[tenants.other]\ntier = \"open\"\n\
         groups = [\"tenancy-no-such-group\"]\n",
        nix_group_name(me.gid)
    );
    let slurm = tenancy_config::slurm_conf::SlurmConf::parse(
        SLURM_CONF,
        std::path::Path::new("/etc/slurm/slurm.conf"),
    )
    .unwrap();
    (
        slurm,
        Config::parse(&text, std::path::Path::new("/t.toml")).unwrap(),
    )
}

/// Node pools: a pool tenant's job excludes every node outside its pool (with the user's
/// own exclusions kept), another tenant's every pool node; a --nodelist against the rules
/// is refused.
#[test]
fn pools_become_excluded_nodes_and_contrary_nodelists_are_refused() {
    let (slurm, config) = pooled("");
    let mine = submission(&["SPANK_TENANCY_TENANT=mine"], None).unwrap();
    let a = decide_in(&mine, &config, Some(&slurm)).unwrap();
    assert_eq!(a.placement.exc_nodes.as_deref(), Some("n[1-2]"));
    let mut user = mine.clone();
    user.exc_nodes = Some("n4".into());
    let a = decide_in(&user, &config, Some(&slurm)).unwrap();
    assert_eq!(a.placement.exc_nodes.as_deref(), Some("n4,n[1-2]"));
    let mut wrong = mine.clone();
    wrong.req_nodes = Some("n[1,3]".into());
    let e = decide_in(&wrong, &config, Some(&slurm)).unwrap_err();
    assert!(
        e.contains("--nodelist names n1: node n1 is outside the node pool of tenant 'mine'"),
        "{e}"
    );
    // The other tenant's rules, decided for a resolved job of it (its group is unknown).
    assert_eq!(
        scheduler::pool_placement(&config, "other", &slurm, None, None)
            .unwrap()
            .as_deref(),
        Some("n[3-4]")
    );
    let e = scheduler::pool_placement(&config, "other", &slurm, Some("n4"), None).unwrap_err();
    assert!(
        e.contains("node n4 is in the node pool of tier 'own'"),
        "{e}"
    );
    // Pools and no slurm.conf: refused, not guessed.
    assert!(decide_in(&mine, &config, None)
        .unwrap_err()
        .contains("slurm.conf cannot be read"));
}

/// share_node = false on MCS: the tenant's label, not a node of its own; a label the user
/// chose is refused; without MCS the old exclusivity.
#[test]
fn share_node_false_is_an_mcs_label_where_slurm_has_mcs() {
    let (slurm, config) = pooled("");
    let mine = submission(&["SPANK_TENANCY_TENANT=mine"], None).unwrap();
    let a = decide_in(&mine, &config, Some(&slurm)).unwrap();
    assert!(!a.exclusive);
    assert_eq!(a.placement.mcs_label.as_deref(), Some("mine"));
    assert!(!a.placement.shared_mcs);
    let mut asked = mine.clone();
    asked.mcs_label = Some("other".into());
    let e = decide_in(&asked, &config, Some(&slurm)).unwrap_err();
    assert!(e.starts_with("--mcs-label=other"), "{e}");
    // ondemandselect filters only --exclusive=mcs jobs: the plugin asks for it.
    let ondemand = tenancy_config::slurm_conf::SlurmConf::parse(
        &SLURM_CONF.replace("ondemand,select", "ondemand,ondemandselect"),
        std::path::Path::new("/s.conf"),
    )
    .unwrap();
    assert!(
        decide_in(&mine, &config, Some(&ondemand))
            .unwrap()
            .placement
            .shared_mcs
    );
    // mcs/account: the label is the job's account, one of the tenant's.
    let account = tenancy_config::slurm_conf::SlurmConf::parse(
        &SLURM_CONF.replace("mcs/label", "mcs/account"),
        std::path::Path::new("/s.conf"),
    )
    .unwrap();
    let a = decide_in(&mine, &config, Some(&account)).unwrap();
    assert_eq!(
        (
            a.placement.mcs_label.as_deref(),
            a.placement.account.as_deref()
        ),
        (Some("mine-acct"), Some("mine-acct"))
    );
    // No MCS: a node of its own, as before.
    let none = tenancy_config::slurm_conf::SlurmConf::parse(
        "NodeName=n[1-4]\n",
        std::path::Path::new("/s.conf"),
    )
    .unwrap();
    let a = decide_in(&mine, &config, Some(&none)).unwrap();
    assert!(a.exclusive && a.placement.mcs_label.is_none());
}

#[test]
fn an_account_change_cannot_contradict_the_tenant() {
    let (_dir, _path, config) = config();
    let uid = rustix_uid();
    assert_eq!(check_account_change(&config, uid, 7, None), Ok(()));
    assert_eq!(
        check_account_change(&config, uid, 7, Some("no-tenants-acct")),
        Ok(())
    );
    assert_eq!(
        check_account_change(&config, uid, 7, Some("mine-acct")),
        Ok(())
    );
    let e = check_account_change(&config, uid, 7, Some("other-acct")).unwrap_err();
    assert!(e.contains("job 7") && e.contains("tenant 'other'"), "{e}");
    // Through the C entry point: an account the prolog would refuse, from anyone.
    let bad = c"bad acct";
    // SAFETY: an all-zero job_desc_msg_t is valid (null pointers, zero numbers).
    let mut desc: sys::job_desc_msg_t = unsafe { std::mem::zeroed() };
    desc.job_id = 7;
    desc.shared = NO_VAL16;
    desc.account = bad.as_ptr().cast_mut();
    // SAFETY: desc lives through the call.
    let rc = unsafe { job_modify(&mut desc, std::ptr::null_mut(), 0) };
    assert_eq!(rc, REFUSED);
}

/// The C entry point with a job description as slurmctld passes it, the message made by
/// Slurm's own `xstrdup` when libslurmfull is installed (as it is where slurmctld runs).
#[test]
fn job_submit_accepts_and_refuses_through_the_c_interface() {
    let (_dir, path, _config) = config();
    std::env::set_var("TENANCY_CONFIG", &path);
    let slurm = c"/usr/lib/x86_64-linux-gnu/slurm-wlm/libslurmfull.so";
    // SAFETY: loading Slurm's library only makes its symbols visible to dlsym.
    let loaded =
        unsafe { !libc::dlopen(slurm.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL).is_null() };
    if !loaded {
        eprintln!("NOTE: {slurm:?} not found: the refusal's message is not checked");
    }
    let run = |env: &[&CStr], account: Option<&CStr>| -> (c_int, Option<String>) {
        let mut vars: Vec<*mut c_char> = env.iter().map(|e| e.as_ptr().cast_mut()).collect();
        // SAFETY: an all-zero job_desc_msg_t is valid (null pointers, zero numbers).
        let mut desc: sys::job_desc_msg_t = unsafe { std::mem::zeroed() };
        desc.user_id = rustix_uid();
        desc.spank_job_env = vars.as_mut_ptr();
        desc.spank_job_env_size = vars.len() as u32;
        desc.account = account.map_or(std::ptr::null_mut(), |a| a.as_ptr().cast_mut());
        let mut msg: *mut c_char = std::ptr::null_mut();
        // SAFETY: desc and msg live through the call.
        let rc = unsafe { job_submit(&mut desc, 0, &mut msg) };
        let text = (!msg.is_null()).then(|| {
            // SAFETY: made by slurm_xstrdup; freed by slurm_xfree as slurmctld does.
            unsafe {
                let t = CStr::from_ptr(msg).to_string_lossy().into_owned();
                let xfree: unsafe extern "C" fn(*mut *mut c_void) =
                    std::mem::transmute(symbol(c"slurm_xfree"));
                let mut p = msg.cast::<c_void>();
                xfree(&mut p);
                t
            }
        });
        (rc, text)
    };
    assert_eq!(run(&[c"SPANK_TENANCY_TENANT=mine"], None), (SUCCESS, None));
    let (rc, msg) = run(&[c"SPANK_TENANCY_TENANT=other"], None);
    assert_eq!(rc, REFUSED);
    if loaded {
        let msg = msg.expect("a message for the submitter");
        assert!(
            msg.starts_with("tenancy: ") && msg.contains("not a member of tenant 'other'"),
            "{msg}"
        );
    }
    assert_eq!(
        run(&[c"SPANK_TENANCY_TENANT=mine"], Some(c"other-acct")).0,
        REFUSED
    );

    // A config that cannot be read refuses every job (fail closed), and says why.
    std::env::set_var("TENANCY_CONFIG", path.with_file_name("missing.toml"));
    let (rc, msg) = run(&[c"SPANK_TENANCY_TENANT=mine"], None);
    assert_eq!(rc, REFUSED);
    if loaded {
        let msg = msg.unwrap();
        assert!(
            msg.contains("cannot read the tenancy config") && msg.contains("missing.toml"),
            "{msg}"
        );
    }
    std::env::remove_var("TENANCY_CONFIG");
}
