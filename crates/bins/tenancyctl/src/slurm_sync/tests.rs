use super::*;

fn config() -> Config {
    let text = r#"
[cluster]
name = "t"
state_dir = "/s"
audit_log = "/a.jsonl"
scratch_root = "/scratch"
[tiers.gpu]
mig_profiles = ["1g.18gb"]
limits = { gpus = 4 }
[tenants.acme]
tier = "gpu"
groups = ["root"]
limits = { mig_slices = { "1g.18gb" = 2 }, running_jobs = 3 }
[tenants.globex]
tier = "gpu"
groups = ["daemon"]
accounts = ["globex-a", "globex-b"]
"#;
    Config::parse(text, std::path::Path::new("/t.toml")).unwrap()
}

fn members() -> BTreeMap<String, BTreeSet<String>> {
    [("acme", vec!["alice"]), ("globex", vec!["bob"])]
        .into_iter()
        .map(|(t, u)| (t.to_string(), u.into_iter().map(String::from).collect()))
        .collect()
}

#[test]
fn plans_accounts_limits_and_users_and_nothing_once_they_are_there() {
    let c = config();
    let mut dbd = Dbd::default();
    dbd.assocs.insert("root".into(), AccountAssoc::default());
    let p = plan(&c, &members(), &dbd).unwrap();
    let shown: Vec<String> = p.iter().map(Change::describe).collect();
    assert_eq!(
        shown,
        [
            "+ add account acme under root (tenant acme, Organization=slurm-tenancy)",
            "+ add account globex under root (tenant globex, Organization=slurm-tenancy)",
            "+ add account globex-a under globex (tenant globex, Organization=slurm-tenancy)",
            "+ add account globex-b under globex (tenant globex, Organization=slurm-tenancy)",
            "~ set on account acme: GrpTRES=gres/gpu=4,gres/gpu:1g.18gb=2 GrpJobs=3",
            "~ set on account globex: GrpTRES=gres/gpu=4",
            "+ add user alice to account acme",
            "+ add user bob to account globex-a",
            "+ add user bob to account globex-b",
        ]
    );
    assert_eq!(
        p[4].args("c1", false).join(" "),
        "-i modify account where name=acme cluster=c1 set GrpTRES=gres/gpu=4,gres/gpu:1g.18gb=2 GrpJobs=3"
    );
    assert_eq!(
        p[4].args("c1", true).join(" "),
        "-i modify account where name=acme cluster=c1 set GrpTRES=gres/gpu=-1,gres/gpu:1g.18gb=-1 GrpJobs=-1"
    );
    // slurmdbd as the plan leaves it: nothing to do.
    let mine = (
        "slurm-tenancy tenant x".to_string(),
        ORGANIZATION.to_string(),
    );
    for (a, parent) in [
        ("acme", "root"),
        ("globex", "root"),
        ("globex-a", "globex"),
        ("globex-b", "globex"),
    ] {
        dbd.accounts.insert(a.into(), mine.clone());
        dbd.assocs.insert(
            a.into(),
            AccountAssoc {
                parent: parent.into(),
                ..Default::default()
            },
        );
    }
    dbd.assocs.get_mut("acme").unwrap().grp_tres = parse_tres("gres/gpu=4,gres/gpu:1g.18gb=2");
    dbd.assocs.get_mut("acme").unwrap().grp_jobs = Some(3);
    dbd.assocs.get_mut("globex").unwrap().grp_tres = parse_tres("gres/gpu=4,cpu=100");
    for (a, u) in [("acme", "alice"), ("globex-a", "bob"), ("globex-b", "bob")] {
        dbd.users.insert((a.into(), u.into()));
    }
    assert_eq!(plan(&c, &members(), &dbd).unwrap(), []);
    // A member who left, from an account sync made; a limit the config dropped; a tenant
    // gone. The admin's cpu limit stays.
    dbd.users.insert(("acme".into(), "carol".into()));
    dbd.assocs
        .get_mut("globex")
        .unwrap()
        .grp_tres
        .insert("node".into(), 2);
    dbd.accounts.insert(
        "initech".into(),
        ("slurm-tenancy tenant initech".into(), ORGANIZATION.into()),
    );
    dbd.assocs.insert(
        "initech".into(),
        AccountAssoc {
            parent: "root".into(),
            ..Default::default()
        },
    );
    dbd.accounts
        .insert("admins".into(), ("theirs".into(), "site".into()));
    dbd.assocs.insert(
        "admins".into(),
        AccountAssoc {
            parent: "root".into(),
            ..Default::default()
        },
    );
    let shown: Vec<String> = plan(&c, &members(), &dbd)
        .unwrap()
        .iter()
        .map(Change::describe)
        .collect();
    assert_eq!(
        shown,
        [
            "~ set on account globex: GrpTRES=node=-1",
            "- remove user carol from account acme (no longer a member)",
            "- remove account initech (made for tenant initech, no longer in the config)",
        ]
    );
}

#[test]
fn an_unknown_tres_is_named_with_the_slurm_conf_line_to_add() {
    let mut dbd = Dbd::default();
    dbd.tres.insert("gres/gpu".into());
    let e = plan(&config(), &members(), &dbd).unwrap_err();
    assert!(
        e.contains("gres/gpu:1g.18gb is a TRES slurmdbd does not know"),
        "{e}"
    );
}
