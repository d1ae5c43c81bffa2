use super::*;

fn spec() -> FirewallSpec {
    FirewallSpec {
        table_name: "tenancy".into(),
        cgroup: CgroupLayout::hybrid("tenancy"),
        tenants: vec![
            TenantNet {
                name: "acme".into(),
                id: 1,
                egress: vec![
                    Dest::parse("10.20.0.0/16:443/tcp").unwrap(),
                    Dest::parse("[fd00::/8]:53/udp").unwrap(),
                ],
            },
            TenantNet {
                name: "beta-lab".into(),
                id: 2,
                egress: vec![Dest::parse("192.168.7.0/24").unwrap()],
            },
        ],
        infrastructure: vec![
            Dest::parse("10.0.0.53:53").unwrap(),
            Dest::parse("10.0.0.10:6817-6818/tcp").unwrap(),
        ],
        slurm: None,
        cross_node: None,
    }
}

/// On a pure cgroup v2 node the table has the jobs maps from the start (it is applied before
/// slurmd makes its scope), dispatched at the job folders' level after the tenant map; a
/// hybrid node's table has none.
#[test]
fn pure_v2_tables_dispatch_jobs_anchored_in_slurms_folders() {
    let mut s = spec();
    assert!(!ruleset(&s).unwrap().contains("jobs_out"));
    s.cgroup = CgroupLayout::unified("tenancy");
    let r = ruleset(&s).unwrap();
    // Both jobs maps, and the base chains' lookups in them one level below the tenants'.
    let missing: Vec<&str> = [
        "map jobs_out {\n\t\ttype cgroupsv2 : verdict",
        "map jobs_in {\n\t\ttype cgroupsv2 : verdict",
        "socket cgroupv2 level 3 vmap @jobs_out",
        "socket cgroupv2 level 3 vmap @jobs_in",
    ]
    .into_iter()
    .filter(|want| !r.contains(want))
    .collect();
    assert!(missing.is_empty(), "{missing:?} missing:\n{r}");
    let tenant = r.find("socket cgroupv2 level 2 vmap").unwrap();
    assert!(tenant < r.find("vmap @jobs_out").unwrap());
}

fn cross_spec() -> FirewallSpec {
    let mut s = spec();
    s.cross_node = Some(CrossNode {
        node_network: Ipv4Net::parse("10.0.0.0/24").unwrap(),
        prefixes: vec![
            ("acme".into(), Ipv4Net::parse("10.64.1.0/24").unwrap()),
            ("beta-lab".into(), Ipv4Net::parse("10.64.2.0/24").unwrap()),
        ],
        node: Some(NodeAddr {
            interface: "eth0".into(),
            address: "10.0.0.7".parse().unwrap(),
        }),
    });
    s
}

/// Snapshot of the rules with tenant identity across nodes.
#[test]
fn cross_node_ruleset_matches_snapshot() {
    assert_snapshot(&ruleset(&cross_spec()).unwrap(), "ruleset_cross_node.nft");
    let c = cross_spec().cross_node.unwrap();
    assert_eq!(c.address("acme"), Some("10.64.1.7".parse().unwrap()));
}

#[test]
fn cross_node_specs_are_checked() {
    let mut s = cross_spec();
    s.cross_node.as_mut().unwrap().prefixes.pop();
    assert!(ruleset(&s)
        .unwrap_err()
        .to_string()
        .contains("no address_prefix"));
    let mut s = cross_spec();
    s.cross_node.as_mut().unwrap().prefixes[1].1 = Ipv4Net::parse("10.64.0.0/16").unwrap();
    assert!(ruleset(&s).unwrap_err().to_string().contains("overlap"));
    let mut s = cross_spec();
    s.cross_node.as_mut().unwrap().prefixes[1].1 = Ipv4Net::parse("10.64.2.0/25").unwrap();
    assert!(ruleset(&s).is_err());
    let mut s = cross_spec();
    s.cross_node.as_mut().unwrap().node = None;
    assert!(ruleset(&s).unwrap_err().to_string().contains("this node"));
    let mut s = cross_spec();
    s.cross_node
        .as_mut()
        .unwrap()
        .node
        .as_mut()
        .unwrap()
        .interface = "e; flush".into();
    assert!(ruleset(&s).is_err());
}

/// Snapshot: the checked-in expected script must equal the rendering.
#[test]
fn ruleset_matches_snapshot() {
    assert_snapshot(&ruleset(&spec()).unwrap(), "ruleset_hybrid.nft");
}

#[test]
fn pure_v2_layout_renders_level_2_without_unified() {
    let mut s = spec();
    s.cgroup = CgroupLayout::unified("tenancy");
    let r = ruleset(&s).unwrap();
    assert!(r.contains("socket cgroupv2 level 2 vmap { \"tenancy/acme\" : goto out_1"));
    assert!(!r.contains("unified"));
}

#[test]
fn replace_script_deletes_only_own_table() {
    let r = replace_script(&spec()).unwrap();
    assert!(r.starts_with("table inet tenancy\ndelete table inet tenancy\n"));
    assert!(!r.contains("flush ruleset"));
}

#[test]
fn rejects_bad_specs() {
    let mut s = spec();
    s.tenants[1].id = 1;
    assert!(ruleset(&s)
        .unwrap_err()
        .to_string()
        .contains("already used"));
    let mut s = spec();
    s.tenants[0].name = "ac\"me".into();
    assert!(ruleset(&s).is_err());
    let mut s = spec();
    s.tenants[0].id = 0;
    assert!(ruleset(&s).is_err());
    let mut s = spec();
    s.table_name = "t; flush ruleset".into();
    assert!(ruleset(&s).is_err());
    assert!(add_job(&spec(), "nobody", 5).is_err());
    assert!(add_job(&spec(), "acme", 0).is_err());
}

#[test]
fn empty_tenant_list_renders() {
    let mut s = spec();
    s.tenants.clear();
    let r = ruleset(&s).unwrap();
    assert!(!r.contains("vmap"));
}

#[test]
fn spec_and_jobnet_serde() {
    let s = spec();
    let j = serde_json::to_string(&s).unwrap();
    assert_eq!(serde_json::from_str::<FirewallSpec>(&j).unwrap(), s);
    let jn = JobNet {
        tenant: "acme".into(),
        job_id: 3,
        cgroup_path: s.cgroup.job_dir("acme", 3),
        cgroup_id: Some(77),
    };
    let j = serde_json::to_string(&jn).unwrap();
    assert_eq!(serde_json::from_str::<JobNet>(&j).unwrap(), jn);
}

/// `got` equals the checked-in tests/expected/`name` (UPDATE_EXPECT=1 rewrites it, to review).
fn assert_snapshot(got: &str, name: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/expected")
        .join(name);
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(&path, got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        got, want,
        "rendering changed; rerun with UPDATE_EXPECT=1 and review"
    );
}
