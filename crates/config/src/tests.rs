use super::*;
use tenancy_test_support::TenancyToml;

const SAMPLE: &str = include_str!("../examples/tenancy.toml");

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/etc/slurm/tenancy.toml"))
}

/// Replaces one exact snippet of the sample, so each bad config differs in one place.
fn sample_with(from: &str, to: &str) -> String {
    assert!(SAMPLE.contains(from), "sample lacks {from}");
    SAMPLE.replacen(from, to, 1)
}

fn single_problem(text: &str) -> Problem {
    match parse(text) {
        Err(ConfigError::Invalid(p)) => {
            assert_eq!(p.len(), 1, "expected one problem, got {p:#?}");
            p[0].clone()
        }
        other => panic!("expected an invalid config, got {other:?}"),
    }
}

fn line_of(text: &str, needle: &str) -> usize {
    text[..text.find(needle).unwrap()].matches('\n').count() + 1
}

#[test]
fn sample_is_accepted() {
    let c = parse(SAMPLE).unwrap();
    assert_eq!(c.tenants.len(), 2);
    assert_eq!(c.tiers["regulated"].scratch_on_exit, ScratchOnExit::Retain);
    assert!(!c.tiers["regulated"].share_gpu);
    assert_eq!(c.tenants["globex"].egress.len(), 2);
    assert_eq!(c.infrastructure.len(), 4);
    assert_eq!(c.node.proc_devices, PathBuf::from("/proc/devices"));
    assert_eq!(c.node.squeue, PathBuf::from("/usr/bin/squeue"));
}

#[test]
fn node_squeue_is_an_absolute_path() {
    let mut t = TenancyToml::minimal("c", Path::new("/srv/t"));
    t.node().squeue("/opt/slurm/bin/squeue");
    let c = parse(&t.to_string()).unwrap();
    assert_eq!(c.node.squeue, PathBuf::from("/opt/slurm/bin/squeue"));
    let mut t = TenancyToml::minimal("c", Path::new("/srv/t"));
    t.node().squeue("squeue");
    let p = single_problem(&t.to_string());
    assert!(
        p.message.contains("node.squeue must be an absolute path"),
        "{p:?}"
    );
}

#[test]
fn each_kind_of_bad_config_names_file_line_and_column() {
    let cases: &[(&str, &str, &str, &str)] = &[
        // (from, to, text pointed at, message fragment)
        (
            "share_node = true\nscratch_on_exit = \"wipe\"",
            "share_node = true\nscratch_on_exit = \"wipe\"\ncolour = \"blue\"",
            "colour",
            "unknown field `colour`",
        ),
        (
            "tier = \"internal\"",
            "tier = \"gold\"",
            "\"gold\"",
            "unknown tier 'gold' (known tiers: internal, regulated)",
        ),
        (
            "10.20.0.0/16:443/tcp",
            "10.20.0.0/33:443/tcp",
            "\"10.20.0.0/33:443/tcp\"",
            "prefix length 33 is larger than 32",
        ),
        (
            "10.20.0.0/16:443/tcp",
            "10.20.0.0/16:99999/tcp",
            "\"10.20.0.0/16:99999/tcp\"",
            "is not in 1..=65535",
        ),
        (
            "[tenants.acme]",
            "[tenants.\"../etc\"]",
            "\"../etc\"",
            "bad tenant name '../etc'",
        ),
        (
            "[tiers.internal]",
            "[tiers.Gold_Tier]\n[tiers.internal]",
            "Gold_Tier",
            "bad tier name",
        ),
        (
            "groups = [\"globex\"]",
            "groups = [\"acme\"]",
            "\"acme\"]\naccounts = [\"globex\"",
            "group 'acme' is claimed by tenants 'acme' and 'globex'",
        ),
        (
            "\"/scratch\"",
            "\"scratch\"",
            "\"scratch\"",
            "cluster.scratch_root must be an absolute path",
        ),
        (
            "\"/var/log/slurm-tenancy/audit.jsonl\"",
            "\"logs/audit.jsonl\"",
            "\"logs/audit.jsonl\"",
            "cluster.audit_log must be an absolute path",
        ),
        (
            "share_gpu = false",
            "share_gpu = \"no\"",
            "\"no\"",
            "invalid type",
        ),
    ];
    for (from, to, at, fragment) in cases {
        let text = sample_with(from, to);
        let p = single_problem(&text);
        let shown = p.to_string();
        assert!(
            shown.contains(fragment),
            "{shown}\n does not say {fragment}"
        );
        let needle_pos = text.find(at).unwrap_or_else(|| panic!("{at} not in text"));
        let want_line = line_of(&text, at);
        assert_eq!(p.line, want_line, "{shown}");
        let want_col = needle_pos - text[..needle_pos].rfind('\n').map_or(0, |i| i + 1) + 1;
        // toml reports unknown fields and type errors at the key or value: accept the line.
        if !fragment.contains("unknown field") && !fragment.contains("invalid type") {
            assert_eq!(p.column, want_col, "{shown}");
        }
        assert!(shown.starts_with(&format!(
            "/etc/slurm/tenancy.toml:{}:{}: ",
            p.line, p.column
        )));
        assert!(p.excerpt.contains('^'), "{shown}");
    }
}

#[test]
fn all_problems_are_reported_at_once() {
    let text = sample_with("tier = \"internal\"", "tier = \"gold\"")
        .replace("\"/scratch\"", "\"scratch\"");
    match parse(&text) {
        Err(ConfigError::Invalid(p)) => assert_eq!(p.len(), 2, "{p:#?}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn config_search_order() {
    let dir = std::env::temp_dir().join(format!("tenancy-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let beside_slurm = dir.join("tenancy.toml");
    std::fs::write(&beside_slurm, SAMPLE).unwrap();
    let slurm_conf = dir.join("slurm.conf");
    let explicit = Path::new("/x/explicit.toml");
    let env = PathBuf::from("/x/env.toml");
    assert_eq!(
        Config::locate(Some(explicit), Some(env.clone()), Some(slurm_conf.clone())).unwrap(),
        explicit
    );
    assert_eq!(
        Config::locate(None, Some(env.clone()), Some(slurm_conf.clone())).unwrap(),
        env
    );
    assert_eq!(
        Config::locate(None, None, Some(slurm_conf)).unwrap(),
        beside_slurm
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Tenants over groups that exist on every Debian system, so resolution runs through NSS.
fn nss_config() -> String {
    let mut c = TenancyToml::under("t", Path::new("/tmp"));
    c.tier("internal").mig_profiles(["1g.18gb"]);
    c.tenant("acme")
        .tier("internal")
        .groups(["daemon"])
        .accounts(["acme-acct"]);
    c.tenant("globex").tier("internal").groups(["bin", "sys"]);
    c.to_string()
}

fn who(gids: &[u32]) -> Identity {
    Identity::with_groups(4242, "u4242", gids.to_vec())
}

#[test]
fn tenant_resolution_refuses_precisely() {
    let c = parse(&nss_config()).unwrap();
    let gid = |n: &str| group_gid(n).unwrap();
    let (daemon, bin) = (gid("daemon"), gid("bin"));

    let r = c
        .resolve(&who(&[daemon]), None, None, Some("1g.18gb"))
        .unwrap();
    assert_eq!(
        (r.tenant.as_str(), r.profile.as_deref()),
        ("acme", Some("1g.18gb"))
    );

    let e = c
        .resolve(&who(&[daemon]), None, Some("globex"), None)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "user u4242 is not a member of tenant 'globex' (members need one of the groups bin, sys)"
    );
    let e = c
        .resolve(&who(&[bin]), None, Some("acme"), None)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "user u4242 is not a member of tenant 'acme' (members need group daemon)"
    );

    let e = c
        .resolve(&who(&[daemon]), None, Some("nope"), None)
        .unwrap_err();
    assert!(e.to_string().starts_with("unknown tenant 'nope'"), "{e}");
    let e = c
        .resolve(&who(&[daemon]), None, Some("../etc"), None)
        .unwrap_err();
    assert!(matches!(e, Refusal::BadTenantName(_)));

    let e = c
        .resolve(&who(&[daemon, bin]), None, None, None)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "user u4242 is a member of several tenants (acme, globex): choose one with --tenant"
    );
    // The account picks among the tenants the user belongs to.
    let r = c
        .resolve(&who(&[daemon, bin]), Some("acme-acct"), None, None)
        .unwrap();
    assert_eq!(r.tenant, "acme");
    let e = c
        .resolve(
            &who(&[daemon, bin]),
            Some("acme-acct"),
            Some("globex"),
            None,
        )
        .unwrap_err();
    assert!(matches!(e, Refusal::AccountMismatch { .. }), "{e}");
    // An account never makes a member.
    let e = c
        .resolve(&who(&[bin]), Some("acme-acct"), None, None)
        .unwrap_err();
    assert!(matches!(e, Refusal::NotMember { .. }), "{e}");

    let e = c.resolve(&who(&[]), None, None, None).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("user u4242 is not a member of any tenant (acme needs group daemon"),
        "{e}"
    );

    let e = c
        .resolve(&who(&[daemon]), None, None, Some("3g.71gb"))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "MIG profile '3g.71gb' is not allowed for tenant 'acme' (tier internal allows 1g.18gb)"
    );
    let e = c
        .resolve(&who(&[daemon]), None, None, Some("1g;rm -rf"))
        .unwrap_err();
    assert!(matches!(e, Refusal::BadProfile(_)));
}

#[test]
fn identity_comes_from_nss() {
    let root = Identity::from_uid(0).unwrap();
    assert_eq!(root.user, "root");
    assert!(root.gids().unwrap().contains(&0));
    assert!(Identity::from_uid(3_999_999_999).is_err());
}

#[test]
fn profile_and_device_class_syntax() {
    for ok in ["1g.18gb", "1g.18gb+me", "7g.141gb", "3g.71gb"] {
        assert!(valid_profile(ok), "{ok}");
    }
    for bad in ["", "1g", "8g.10gb", "1g.gb", "1g.18gb+xx", "../1g.18gb"] {
        assert!(!valid_profile(bad), "{bad}");
    }
    assert!(valid_device_class("c 1:3 rwm").is_ok());
    assert!(valid_device_class("c 195:* r").is_ok());
    assert!(valid_device_class("b *:* r").is_ok());
    // What the devices layer would refuse at every job start is refused here.
    for bad in [
        "a *:* rwm",
        "c 1:3",
        "c *:* rw",
        "c 5000:0 r",
        "c 1:1 rr",
        "c 1:+5 r",
    ] {
        assert!(valid_device_class(bad).is_err(), "{bad}");
    }
}

#[test]
fn resolution_gives_the_gid_of_the_tenants_first_group() {
    let c = parse(&nss_config()).unwrap();
    let gid = |n: &str| group_gid(n).unwrap();
    let (bin, sys) = (gid("bin"), gid("sys"));
    // Member through the second group: the tenant's group is still the first one.
    let r = c.resolve(&who(&[sys]), None, Some("globex"), None).unwrap();
    assert_eq!((r.tenant.as_str(), r.tenant_gid), ("globex", Some(bin)));
    // Without a requested tenant, membership finds it too, and so does the account's tenant.
    let r = c.resolve(&who(&[sys]), None, None, None).unwrap();
    assert_eq!((r.tenant.as_str(), r.tenant_gid), ("globex", Some(bin)));
    let daemon = gid("daemon");
    let r = c
        .resolve(&who(&[daemon, sys]), Some("acme-acct"), None, None)
        .unwrap();
    assert_eq!((r.tenant.as_str(), r.tenant_gid), ("acme", Some(daemon)));
}

#[test]
fn cross_node_keys_are_checked() {
    let text = sample_with("[network]\n", "[network]\nnode_network = \"10.0.2.0/24\"\n").replacen(
        "egress = [\"10.20.0.0/16:443/tcp\"]",
        "egress = [\"10.20.0.0/16:443/tcp\"]\naddress_prefix = \"10.64.1.0/24\"",
        1,
    );
    // globex has none.
    let p = single_problem(&text);
    assert!(
        p.message.contains("tenant 'globex' has no address_prefix"),
        "{p:?}"
    );
    let ok = text.replacen(
        "accounts = [\"globex\", \"globex-audit\"]",
        "accounts = [\"globex\", \"globex-audit\"]\naddress_prefix = \"10.64.2.0/24\"",
        1,
    );
    let c = parse(&ok).unwrap();
    assert_eq!(c.node_network.unwrap().to_string(), "10.0.2.0/24");
    assert_eq!(
        c.tenants["globex"].address_prefix.unwrap().to_string(),
        "10.64.2.0/24"
    );
    let p = single_problem(&ok.replace("10.64.2.0/24", "10.64.0.0/16"));
    assert!(p.message.contains("overlap"), "{p:?}");
    let p = single_problem(&ok.replace("10.64.2.0/24", "10.64.2.0/25"));
    assert!(p.message.contains("fewer addresses"), "{p:?}");
    let p = single_problem(&ok.replace("10.64.2.0/24", "10.0.2.0/24"));
    assert!(p.message.contains("overlaps node_network"), "{p:?}");
    let p = single_problem(&ok.replace("10.64.2.0/24", "10.64.2.1/24"));
    assert!(p.message.contains("host bits"), "{p:?}");
    let p = single_problem(&text.replacen("node_network = \"10.0.2.0/24\"\n", "", 1));
    assert!(
        p.message.contains("no\n") || p.message.contains("node_network"),
        "{p:?}"
    );
}

/// `scratch_encryption`: off unless a tier says "required"; anything else is refused, naming
/// the tier and the two values.
#[test]
fn scratch_encryption_is_off_unless_required() {
    let c = parse(SAMPLE).unwrap();
    assert_eq!(
        c.tiers["regulated"].scratch_encryption,
        ScratchEncryption::Off
    );
    let required = sample_with(
        "retain_days = 30\n",
        "retain_days = 30\nscratch_encryption = \"required\"\n",
    );
    let c = parse(&required).unwrap();
    assert_eq!(
        c.tiers["regulated"].scratch_encryption,
        ScratchEncryption::Required
    );
    assert_eq!(
        c.tiers["internal"].scratch_encryption,
        ScratchEncryption::Off
    );
    let off = sample_with(
        "retain_days = 30\n",
        "retain_days = 30\nscratch_encryption = \"off\"\n",
    );
    assert_eq!(
        parse(&off).unwrap().tiers["regulated"].scratch_encryption,
        ScratchEncryption::Off
    );
    for bad in ["\"yes\"", "\"Required\"", "\"\""] {
        let text = sample_with(
            "retain_days = 30\n",
            &format!("retain_days = 30\nscratch_encryption = {bad}\n"),
        );
        let p = single_problem(&text);
        assert!(
            p.message.contains("bad scratch_encryption")
                && p.message.contains("tier 'regulated'")
                && p.message.contains("\"required\"")
                && p.message.contains("\"off\""),
            "{p:?}"
        );
        assert_eq!(p.line, line_of(&text, "scratch_encryption"), "{p:?}");
    }
    // Not a string at all: refused by the parser, with its position.
    let text = sample_with(
        "retain_days = 30\n",
        "retain_days = 30\nscratch_encryption = true\n",
    );
    assert!(parse(&text).is_err());
}

/// Quotas: a tier default, a tenant's own keys over it, the GrpTRES they make; and the bad
/// inputs, each a located problem.
#[test]
fn limits_merge_over_the_tier_default_and_bad_ones_are_located() {
    let text = sample_with(
        "scratch_on_exit = \"retain\"",
        "scratch_on_exit = \"retain\"\nrequire_limits = true\nlimits = { gpus = 4, running_jobs = 10 }",
    )
    .replace(
        "accounts = [\"globex\", \"globex-audit\"]",
        "accounts = [\"globex\", \"globex-audit\"]\nlimits = { gpus = 2, mig_slices = { \"3g.71gb\" = 2 } }",
    );
    let c = parse(&text).unwrap();
    let l = &c.tenants["globex"].limits;
    assert_eq!((l.gpus, l.running_jobs), (Some(2), Some(10)));
    assert_eq!(
        l.grp_tres().into_iter().collect::<Vec<_>>(),
        [
            ("gres/gpu".to_string(), 2),
            ("gres/gpu:3g.71gb".to_string(), 2)
        ]
    );
    assert!(c.tenants["acme"].limits.is_empty());
    assert!(c.tiers["regulated"].require_limits);

    // A profile the tenant's tier does not offer.
    let bad = text.replace("\"3g.71gb\" = 2", "\"1g.18gb\" = 2");
    let p = single_problem(&bad);
    assert!(
        p.message
            .contains("names profile '1g.18gb', which tier 'regulated' does not offer"),
        "{p}"
    );
    assert_eq!(p.line, line_of(&bad, "\"1g.18gb\" = 2"));
    // A tier that requires limits, and a tenant of it without any.
    let none = sample_with(
        "scratch_on_exit = \"retain\"",
        "scratch_on_exit = \"retain\"\nrequire_limits = true",
    );
    let p = single_problem(&none);
    assert!(
        p.message.contains("tenant 'globex' has no limits") && p.message.contains("require_limits"),
        "{p}"
    );
    let p = single_problem(&sample_with(
        "[tenants.acme]",
        "[tenants.acme]\nlimits = { gpu = 1 }",
    ));
    assert!(p.message.contains("unknown field `gpu`"), "{p}");
}

/// The tests' builder writes the scheduler keys (limits, require_limits, nodes) as the config
/// reads them.
#[test]
fn test_builder_limits_and_pools_parse() {
    use tenancy_test_support::Limits as TomlLimits;
    let mut c = TenancyToml::under("t", Path::new("/tmp"));
    c.tier("internal")
        .mig_profiles(["1g.18gb", "3g.71gb"])
        .require_limits(true)
        .limits(TomlLimits::default().gpus(4).running_jobs(10))
        .nodes("gpu[01-04]");
    c.tenant("acme")
        .tier("internal")
        .groups(["root"])
        .nodes("gpu05")
        .limits(TomlLimits::default().mig_slices("1g.18gb", 2).nodes(1));
    let c = parse(&c.to_string()).unwrap();
    assert!(c.tiers["internal"].require_limits);
    let l = &c.tenants["acme"].limits;
    assert_eq!(
        (l.gpus, l.nodes, l.running_jobs),
        (Some(4), Some(1), Some(10))
    );
    assert_eq!(l.mig_slices.get("1g.18gb"), Some(&2));
    assert_eq!(c.node_refusal("acme", "gpu05"), None);
    assert!(c.node_refusal("acme", "gpu01").is_some());
}

/// Node pools: a hostlist that does not parse, one naming nodes slurm.conf lacks, and which
/// tenant may run where.
#[test]
fn node_pools_parse_are_checked_against_slurm_conf_and_keep_tenants_apart() {
    let text = sample_with(
        "scratch_on_exit = \"retain\"",
        "scratch_on_exit = \"retain\"\nnodes = \"gpu[01-02]\"",
    );
    let c = parse(&text).unwrap();
    assert_eq!(c.pools().len(), 1);
    assert_eq!(c.node_refusal("globex", "gpu01"), None);
    let out = c.node_refusal("globex", "cpu1").unwrap();
    assert!(
        out.contains("outside the node pool of tenant 'globex'"),
        "{out}"
    );
    let theirs = c.node_refusal("acme", "gpu02").unwrap();
    assert!(
        theirs.contains(
            "node pool of tier 'regulated' (gpu[01-02]), which tenant 'acme' may not use"
        ),
        "{theirs}"
    );
    assert_eq!(c.node_refusal("acme", "cpu1"), None);

    let bad = text.replace("gpu[01-02]", "gpu[01-02");
    let p = single_problem(&bad);
    assert!(
        p.message
            .contains("tier 'regulated': nodes 'gpu[01-02' does not parse"),
        "{p}"
    );
    assert_eq!(p.line, line_of(&bad, "nodes = "));

    let slurm = slurm_conf::SlurmConf::parse(
        "NodeName=gpu01 CPUs=2\nNodeName=cpu[1-4]\n",
        Path::new("/etc/slurm/slurm.conf"),
    )
    .unwrap();
    match Config::parse_for(&text, Path::new("/etc/slurm/tenancy.toml"), Some(&slurm)) {
        Err(ConfigError::Invalid(p)) => {
            assert_eq!(p.len(), 1, "{p:#?}");
            assert!(
                p[0].message
                    .contains("names a node that /etc/slurm/slurm.conf does not have: gpu02"),
                "{}",
                p[0]
            );
        }
        other => panic!("{other:?}"),
    }
    // A tenant's own pool inside its tier's: the others of the tier stay out of it.
    let nested = text.replace(
        "accounts = [\"globex\", \"globex-audit\"]",
        "accounts = [\"globex\", \"globex-audit\"]\nnodes = \"gpu02\"",
    );
    let c = parse(&nested).unwrap();
    assert_eq!(c.node_refusal("globex", "gpu02"), None);
    assert!(c.node_refusal("globex", "gpu01").is_some());
}
