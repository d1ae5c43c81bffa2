//! `tenancyctl slurm sync`: the tenants' quotas as slurmdbd associations, which slurmctld
//! enforces (`AccountingStorageEnforce=associations,limits`): per tenant an account named after
//! it carrying its limits (`GrpTRES` with `gres/gpu`, the typed `gres/gpu:<profile>` and
//! `node`; `GrpJobs`), its other accounts under it, and its members (from its groups) as users
//! of its accounts.
//!
//! It reads slurmdbd with `sacctmgr`, prints what it would change and, with `--apply`, runs the
//! changes one `sacctmgr -i` command each. A failed command undoes the ones before it (each
//! change has its inverse), so nothing is left half-applied; the error names the command and
//! what sacctmgr said. Accounts it makes carry `Organization=slurm-tenancy`: it removes only
//! what it made (users of its own accounts who left the tenant, its accounts of tenants no
//! longer in the config), and clears limits only on its own accounts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use tenancy_config::slurm_conf::SlurmConf;
use tenancy_config::{Config, Identity};

/// The mark of what sync made.
pub const ORGANIZATION: &str = "slurm-tenancy";

#[derive(clap::Args)]
pub struct SyncArgs {
    /// Make the changes (default: only show them)
    #[arg(long)]
    pub apply: bool,
    /// slurm.conf, for ClusterName (default: SLURM_CONF, else /etc/slurm/slurm.conf)
    #[arg(long)]
    pub slurm_conf: Option<PathBuf>,
    /// The cluster's name in slurmdbd (default: slurm.conf's ClusterName)
    #[arg(long)]
    pub cluster: Option<String>,
    /// The sacctmgr to run
    #[arg(long, default_value = "sacctmgr")]
    pub sacctmgr: PathBuf,
}

/// One account's association in the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccountAssoc {
    pub parent: String,
    pub grp_tres: BTreeMap<String, i64>,
    pub grp_jobs: Option<i64>,
}

/// What slurmdbd holds for the cluster, as far as sync looks.
#[derive(Debug, Clone, Default)]
pub struct Dbd {
    /// account -> (description, organization), every account slurmdbd knows.
    pub accounts: BTreeMap<String, (String, String)>,
    /// account -> its association in the cluster.
    pub assocs: BTreeMap<String, AccountAssoc>,
    /// (account, user) associations in the cluster.
    pub users: BTreeSet<(String, String)>,
    /// TRES names slurmdbd knows (`gres/gpu:1g.18gb`, `node`).
    pub tres: BTreeSet<String>,
}

/// sacctmgr, run with arguments, never through a shell.
pub struct Sacctmgr {
    pub program: PathBuf,
}

impl Sacctmgr {
    fn shown(&self, args: &[String]) -> String {
        let mut s = self.program.display().to_string();
        for a in args {
            if a.contains(' ') {
                s.push_str(&format!(" '{a}'"));
            } else {
                s.push(' ');
                s.push_str(a);
            }
        }
        s
    }

    /// Runs sacctmgr; the error names the command and what it said.
    pub fn run(&self, args: &[String]) -> Result<String, String> {
        let o = Command::new(&self.program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| {
                format!(
                    "`{}`: {e}{}",
                    self.shown(args),
                    if e.kind() == std::io::ErrorKind::NotFound {
                        " (sacctmgr is not installed here: apt-get install slurm-client, or \
                         pass --sacctmgr PATH)"
                    } else {
                        ""
                    }
                )
            })?;
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let err = String::from_utf8_lossy(&o.stderr).trim().to_string();
        // sacctmgr prints some failures on stdout with status 0 ("Nothing new added",
        // " Unknown ..."): errors on stderr count whatever the status.
        let failed = !o.status.success() || err.lines().any(|l| l.contains("rror"));
        if failed {
            let said = [err.as_str(), out.trim()]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
            return Err(format!(
                "`{}` failed ({}): {}",
                self.shown(args),
                o.status,
                if said.is_empty() { "no output" } else { &said }
            ));
        }
        Ok(out)
    }

    fn rows(&self, args: &[&str]) -> Result<Vec<Vec<String>>, String> {
        let args: Vec<String> = ["-n", "-P"]
            .iter()
            .chain(args)
            .map(|s| s.to_string())
            .collect();
        Ok(self
            .run(&args)?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.split('|').map(|f| f.trim().to_string()).collect())
            .collect())
    }

    /// Reads what sync compares, for `cluster`.
    pub fn read(&self, cluster: &str) -> Result<Dbd, String> {
        let mut dbd = Dbd::default();
        let clusters = self.rows(&["show", "cluster", "format=cluster"])?;
        if !clusters
            .iter()
            .any(|r| r.first().is_some_and(|c| c == cluster))
        {
            return Err(format!(
                "cluster '{cluster}' is not in slurmdbd (it has: {}): `sacctmgr add cluster \
                 {cluster}`, or pass --cluster",
                clusters
                    .iter()
                    .filter_map(|r| r.first().cloned())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for r in self.rows(&["show", "account", "format=account,description,organization"])? {
            if let [a, d, o, ..] = r.as_slice() {
                dbd.accounts.insert(a.clone(), (d.clone(), o.clone()));
            }
        }
        let filter = format!("cluster={cluster}");
        for r in self.rows(&[
            "show",
            "association",
            "where",
            &filter,
            "format=account,user,parentname,grptres,grpjobs",
        ])? {
            let [account, user, parent, tres, jobs, ..] = r.as_slice() else {
                continue;
            };
            if !user.is_empty() {
                dbd.users.insert((account.clone(), user.clone()));
                continue;
            }
            dbd.assocs.insert(
                account.clone(),
                AccountAssoc {
                    parent: parent.clone(),
                    grp_tres: parse_tres(tres),
                    grp_jobs: jobs.parse().ok(),
                },
            );
        }
        for r in self.rows(&["show", "tres", "format=type,name"])? {
            if let [t, n, ..] = r.as_slice() {
                dbd.tres.insert(if n.is_empty() {
                    t.clone()
                } else {
                    format!("{t}/{n}")
                });
            }
        }
        Ok(dbd)
    }
}

/// `gres/gpu=8,node=2` as sacctmgr prints GrpTRES.
pub fn parse_tres(s: &str) -> BTreeMap<String, i64> {
    s.split(',')
        .filter_map(|i| i.split_once('='))
        .filter_map(|(k, v)| Some((k.trim().to_string(), v.trim().parse().ok()?)))
        .collect()
}

fn managed(tres: &str) -> bool {
    tres == "gres/gpu" || tres.starts_with("gres/gpu:") || tres == "node"
}

/// One change, with what undoes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    AddAccount {
        account: String,
        parent: String,
        tenant: String,
    },
    MoveAccount {
        account: String,
        parent: String,
        from: String,
    },
    SetLimits {
        account: String,
        /// TRES -> new value (-1 clears).
        tres: BTreeMap<String, i64>,
        /// TRES -> value before (-1: unset), for the undo.
        before: BTreeMap<String, i64>,
        jobs: Option<(i64, i64)>,
    },
    AddUser {
        user: String,
        account: String,
    },
    RemoveUser {
        user: String,
        account: String,
    },
    RemoveAccount {
        account: String,
        parent: String,
        tenant: String,
    },
}

fn tres_text(m: &BTreeMap<String, i64>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

impl Change {
    /// What the plan shows.
    pub fn describe(&self) -> String {
        match self {
            Change::AddAccount { account, parent, tenant } => format!(
                "+ add account {account} under {parent} (tenant {tenant}, Organization={ORGANIZATION})"
            ),
            Change::MoveAccount { account, parent, from } => {
                format!("~ move account {account} from under {from} to under {parent}")
            }
            Change::SetLimits { account, tres, jobs, .. } => {
                let mut s = format!("~ set on account {account}:");
                if !tres.is_empty() {
                    s.push_str(&format!(" GrpTRES={}", tres_text(tres)));
                }
                if let Some((new, _)) = jobs {
                    s.push_str(&format!(" GrpJobs={new}"));
                }
                s
            }
            Change::AddUser { user, account } => format!("+ add user {user} to account {account}"),
            Change::RemoveUser { user, account } => {
                format!("- remove user {user} from account {account} (no longer a member)")
            }
            Change::RemoveAccount { account, tenant, .. } => {
                format!("- remove account {account} (made for tenant {tenant}, no longer in the config)")
            }
        }
    }

    fn args(&self, cluster: &str, undo: bool) -> Vec<String> {
        let c = format!("cluster={cluster}");
        let s = |v: &[&str]| -> Vec<String> {
            std::iter::once("-i")
                .chain(v.iter().copied())
                .map(String::from)
                .collect()
        };
        let add_account = |account: &str, parent: &str, tenant: &str| {
            s(&[
                "add",
                "account",
                account,
                &c,
                &format!("parent={parent}"),
                &format!("description=slurm-tenancy tenant {tenant}"),
                &format!("organization={ORGANIZATION}"),
            ])
        };
        let move_to = |account: &str, parent: &str| {
            s(&[
                "modify",
                "account",
                "where",
                &format!("name={account}"),
                &c,
                "set",
                &format!("parent={parent}"),
            ])
        };
        let limits = |account: &str, tres: &BTreeMap<String, i64>, jobs: Option<i64>| {
            let mut v = vec![
                "modify".to_string(),
                "account".into(),
                "where".into(),
                format!("name={account}"),
                c.clone(),
                "set".into(),
            ];
            if !tres.is_empty() {
                v.push(format!("GrpTRES={}", tres_text(tres)));
            }
            if let Some(j) = jobs {
                v.push(format!("GrpJobs={j}"));
            }
            s(&v.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let user = |verb: &str, user: &str, account: &str| {
            s(&[verb, "user", user, &format!("account={account}"), &c])
        };
        let delete_account = |account: &str| s(&["delete", "account", account, &c]);
        match (self, undo) {
            (
                Change::AddAccount {
                    account,
                    parent,
                    tenant,
                },
                false,
            ) => add_account(account, parent, tenant),
            (Change::AddAccount { account, .. }, true) => delete_account(account),
            (
                Change::MoveAccount {
                    account, parent, ..
                },
                false,
            ) => move_to(account, parent),
            (Change::MoveAccount { account, from, .. }, true) => move_to(account, from),
            (
                Change::SetLimits {
                    account,
                    tres,
                    jobs,
                    ..
                },
                false,
            ) => limits(account, tres, jobs.map(|j| j.0)),
            (
                Change::SetLimits {
                    account,
                    before,
                    jobs,
                    ..
                },
                true,
            ) => limits(account, before, jobs.map(|j| j.1)),
            (Change::AddUser { user: u, account }, false) => user("add", u, account),
            (Change::AddUser { user: u, account }, true) => user("delete", u, account),
            (Change::RemoveUser { user: u, account }, false) => user("delete", u, account),
            (Change::RemoveUser { user: u, account }, true) => user("add", u, account),
            (Change::RemoveAccount { account, .. }, false) => delete_account(account),
            (
                Change::RemoveAccount {
                    account,
                    parent,
                    tenant,
                },
                true,
            ) => add_account(account, parent, tenant),
        }
    }
}

/// The members of each tenant by user name (NSS: its groups' members and the users whose
/// primary group is one of them).
pub fn members(config: &Config) -> BTreeMap<String, BTreeSet<String>> {
    config
        .member_uids()
        .into_iter()
        .map(|(t, uids)| {
            let names = uids
                .into_iter()
                .filter_map(|u| Identity::from_uid(u).ok().map(|i| i.user))
                .collect();
            (t, names)
        })
        .collect()
}

/// The changes that make slurmdbd hold the config's tenants, in the order they are applied.
pub fn plan(
    config: &Config,
    members: &BTreeMap<String, BTreeSet<String>>,
    dbd: &Dbd,
) -> Result<Vec<Change>, String> {
    let ours = |a: &str| dbd.accounts.get(a).is_some_and(|(_, o)| o == ORGANIZATION);
    let mut adds = Vec::new();
    let mut moves = Vec::new();
    let mut limits = Vec::new();
    let mut users = Vec::new();
    let mut removals = Vec::new();
    for t in config.tenants.values() {
        let top = t.limit_account().to_string();
        if !dbd.assocs.contains_key(&top) {
            adds.push(Change::AddAccount {
                account: top.clone(),
                parent: "root".into(),
                tenant: t.name.clone(),
            });
        }
        for a in t.job_accounts().into_iter().filter(|a| *a != top) {
            match dbd.assocs.get(&a) {
                None => adds.push(Change::AddAccount {
                    account: a.clone(),
                    parent: top.clone(),
                    tenant: t.name.clone(),
                }),
                Some(assoc) if assoc.parent != top => moves.push(Change::MoveAccount {
                    account: a.clone(),
                    parent: top.clone(),
                    from: assoc.parent.clone(),
                }),
                Some(_) => {}
            }
        }
        // Limits on the tenant's account: what the config sets; on an account of sync's own,
        // the managed items the config no longer sets are cleared.
        let want = t.limits.grp_tres();
        for k in want.keys() {
            if !dbd.tres.is_empty() && !dbd.tres.contains(k) {
                return Err(format!(
                    "tenant '{}': limit {k} is a TRES slurmdbd does not know: add {k} to \
                     AccountingStorageTRES in slurm.conf (e.g. \
                     AccountingStorageTRES=gres/gpu,gres/gpu:1g.18gb) and restart slurmctld",
                    t.name
                ));
            }
        }
        let current = dbd.assocs.get(&top).cloned().unwrap_or_default();
        let mut tres = BTreeMap::new();
        let mut before = BTreeMap::new();
        for (k, v) in &want {
            let now = current.grp_tres.get(k).copied();
            if now != Some(i64::from(*v)) {
                tres.insert(k.clone(), i64::from(*v));
                before.insert(k.clone(), now.unwrap_or(-1));
            }
        }
        let own = ours(&top) || !dbd.assocs.contains_key(&top);
        if own {
            for (k, v) in current.grp_tres.iter().filter(|(k, _)| managed(k)) {
                if !want.contains_key(k) {
                    tres.insert(k.clone(), -1);
                    before.insert(k.clone(), *v);
                }
            }
        }
        let jobs = match (t.limits.running_jobs, current.grp_jobs) {
            (Some(n), now) if now != Some(i64::from(n)) => Some((i64::from(n), now.unwrap_or(-1))),
            (None, Some(now)) if own => Some((-1, now)),
            _ => None,
        };
        if !tres.is_empty() || jobs.is_some() {
            limits.push(Change::SetLimits {
                account: top.clone(),
                tres,
                before,
                jobs,
            });
        }
        let accounts = t.job_accounts();
        let empty = BTreeSet::new();
        let wanted = members.get(&t.name).unwrap_or(&empty);
        for a in &accounts {
            for u in wanted {
                if !dbd.users.contains(&(a.clone(), u.clone())) {
                    users.push(Change::AddUser {
                        user: u.clone(),
                        account: a.clone(),
                    });
                }
            }
            if ours(a) {
                for (_, u) in dbd.users.iter().filter(|(acc, _)| acc == a) {
                    if !wanted.contains(u) {
                        users.push(Change::RemoveUser {
                            user: u.clone(),
                            account: a.clone(),
                        });
                    }
                }
            }
        }
    }
    // Accounts sync made for tenants that are gone: children before parents.
    let wanted: BTreeSet<String> = config
        .tenants
        .values()
        .flat_map(|t| {
            let mut v = t.job_accounts();
            v.push(t.limit_account().to_string());
            v
        })
        .collect();
    let mut gone: Vec<(&String, &AccountAssoc)> = dbd
        .assocs
        .iter()
        .filter(|(a, _)| ours(a) && !wanted.contains(*a))
        .collect();
    gone.sort_by_key(|(a, assoc)| (assoc.parent == "root", (*a).clone()));
    for (a, assoc) in gone {
        let tenant = dbd
            .accounts
            .get(a)
            .and_then(|(d, _)| d.strip_prefix("slurm-tenancy tenant "))
            .unwrap_or("?")
            .to_string();
        removals.push(Change::RemoveAccount {
            account: a.clone(),
            parent: assoc.parent.clone(),
            tenant,
        });
    }
    Ok([adds, moves, limits, users, removals].concat())
}

fn cluster_name(args: &SyncArgs) -> Result<String, String> {
    if let Some(c) = &args.cluster {
        return Ok(c.clone());
    }
    let path = args
        .slurm_conf
        .clone()
        .unwrap_or_else(tenancy_config::slurm_conf::default_path);
    let conf = SlurmConf::load(&path).map_err(|e| format!("{e} (pass --cluster NAME)"))?;
    conf.get("ClusterName")
        .map(|c| c.to_ascii_lowercase())
        .ok_or_else(|| {
            format!(
                "{} has no ClusterName (pass --cluster NAME)",
                path.display()
            )
        })
}

pub fn run(config: &Config, args: &SyncArgs) -> anyhow::Result<ExitCode> {
    let fail = |e: String| anyhow::anyhow!("slurm sync: {e}");
    let cluster = cluster_name(args).map_err(fail)?;
    let sacctmgr = Sacctmgr {
        program: args.sacctmgr.clone(),
    };
    let dbd = sacctmgr.read(&cluster).map_err(fail)?;
    let members = members(config);
    let changes = plan(config, &members, &dbd).map_err(fail)?;
    println!(
        "slurm sync: cluster {cluster}, {} tenant(s)",
        config.tenants.len()
    );
    for t in config.tenants.values() {
        let l = &t.limits;
        let mut limits = tres_text(
            &l.grp_tres()
                .into_iter()
                .map(|(k, v)| (k, i64::from(v)))
                .collect(),
        );
        if let Some(j) = l.running_jobs {
            limits.push_str(&format!(
                "{}GrpJobs={j}",
                if limits.is_empty() { "" } else { " " }
            ));
        }
        let users: Vec<String> = members
            .get(&t.name)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        println!(
            "tenant {}: account {} ({}), GrpTRES {}, users {}",
            t.name,
            t.limit_account(),
            {
                let others: Vec<String> = t
                    .job_accounts()
                    .into_iter()
                    .filter(|a| a != t.limit_account())
                    .collect();
                if others.is_empty() {
                    "no other accounts".to_string()
                } else {
                    format!("over {}", others.join(", "))
                }
            },
            if limits.is_empty() {
                "none".into()
            } else {
                limits
            },
            if users.is_empty() {
                "none".into()
            } else {
                users.join(", ")
            }
        );
    }
    if changes.is_empty() {
        println!("nothing to change: slurmdbd holds the config's tenants");
        return Ok(ExitCode::SUCCESS);
    }
    for c in &changes {
        println!("{}", c.describe());
    }
    if !args.apply {
        println!(
            "{} change(s) to make: run with --apply to make them",
            changes.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut done: Vec<&Change> = Vec::new();
    for c in &changes {
        if let Err(e) = sacctmgr.run(&c.args(&cluster, false)) {
            let mut undo_errors = Vec::new();
            for d in done.iter().rev() {
                if let Err(u) = sacctmgr.run(&d.args(&cluster, true)) {
                    undo_errors.push(u);
                }
            }
            let undone = if undo_errors.is_empty() {
                format!("the {} change(s) made before it were undone", done.len())
            } else {
                format!(
                    "undoing the {} change(s) before it failed too: {}",
                    done.len(),
                    undo_errors.join("; ")
                )
            };
            return Err(fail(format!("{e}; {undone}")));
        }
        done.push(c);
    }
    println!("{} change(s) made", changes.len());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
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
}
