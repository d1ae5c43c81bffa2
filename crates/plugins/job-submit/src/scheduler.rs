//! What job_submit/tenancy sets in an accepted job so that slurmctld itself places it by the
//! tenant's rules, with mechanisms Slurm honours and a user cannot undo with `scontrol update`
//! (job_modify refuses those changes from anyone but an administrator):
//!
//! * Node pools: the job's excluded nodes (`exc_nodes`, `--exclude`) get every node of
//!   slurm.conf its tenant may not use ([`tenancy_config::Config::node_refusal`]); a
//!   `--nodelist` naming one is refused with the reason.
//! * `share_node = false`: the job's MCS label names its tenant (MCSPlugin `mcs/label`: the
//!   tenant's name; `mcs/account`: the tenant's account the job runs under; `mcs/group`: the
//!   tenant's group the user is in) and, with `MCSParameters=...,select` (or `--exclusive=mcs`
//!   for `ondemandselect`, which the plugin sets), slurmctld keeps every job without that label
//!   off the node while the tenant's jobs run, and packs the tenant's jobs together. Without
//!   a usable MCS set-up the job gets a node of its own (`--exclusive`), as before.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tenancy_config::hostlist::{compress, Hostlist};
use tenancy_config::slurm_conf::{self, McsSelect, SlurmConf};
use tenancy_config::{Config, Identity, Resolved};

/// `job_desc_msg_t.bitflags`: the job came from scrontab (slurm.h `CRON_JOB`, every release).
pub const CRON_JOB: u64 = 1 << 22;
/// `job_desc_msg_t.shared` for `--exclusive=mcs`.
pub const JOB_SHARED_MCS: u16 = 3;

/// What the plugin sets in an accepted job besides taking it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// `shared` = JOB_SHARED_NONE: a node of its own.
    pub exclusive: bool,
    /// `shared` = JOB_SHARED_MCS (MCSParameters `ondemandselect` filters only such jobs).
    pub shared_mcs: bool,
    /// The job's MCS label.
    pub mcs_label: Option<String>,
    /// The job's account, when mcs/account needs one of the tenant's and none was given.
    pub account: Option<String>,
    /// The job's excluded nodes (the user's, then the pool rules').
    pub exc_nodes: Option<String>,
}

/// slurm.conf as last read, with the files it came from and their times: slurmctld reads it
/// at start and on `scontrol reconfigure`; the plugin reads it again when a file changed.
static SLURM: Mutex<Option<(FileTimes, Arc<SlurmConf>)>> = Mutex::new(None);

/// The files a slurm.conf was read from, with their modification times then.
type FileTimes = Vec<(PathBuf, Option<SystemTime>)>;

fn modified(p: &PathBuf) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// slurm.conf of this slurmctld (`SLURM_CONF`, else /etc/slurm/slurm.conf).
pub fn current_slurm_conf() -> Result<Arc<SlurmConf>, String> {
    let path = slurm_conf::default_path();
    let mut cached = SLURM.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((files, conf)) = cached.as_ref() {
        if files.first().is_some_and(|(p, _)| *p == path)
            && files.iter().all(|(p, t)| modified(p) == *t)
        {
            return Ok(Arc::clone(conf));
        }
    }
    let conf = Arc::new(SlurmConf::load(&path)?);
    let mut files = vec![(path.clone(), modified(&path))];
    files.extend(conf.included.iter().map(|p| (p.clone(), modified(p))));
    *cached = Some((files, Arc::clone(&conf)));
    Ok(conf)
}

/// Whether the decision needs slurm.conf: node pools, or a tier that shares no node.
pub fn needs_slurm_conf(config: &Config) -> bool {
    config.has_pools() || config.tiers.values().any(|t| !t.share_node)
}

/// The pool rules for one job: the new `exc_nodes`, or the refusal.
pub fn pool_placement(
    config: &Config,
    tenant: &str,
    slurm: &SlurmConf,
    req_nodes: Option<&str>,
    exc_nodes: Option<&str>,
) -> Result<Option<String>, String> {
    if !config.has_pools() {
        return Ok(None);
    }
    if let Some(req) = req_nodes.filter(|r| !r.trim().is_empty()) {
        let list = Hostlist::parse(req).map_err(|e| format!("--nodelist {e}"))?;
        for node in list.names() {
            if let Some(why) = config.node_refusal(tenant, &node) {
                return Err(format!(
                    "--nodelist names {node}: {why}; submit without it, or name nodes the \
                     tenant may use"
                ));
            }
        }
    }
    let forbidden: Vec<&String> = slurm
        .nodes
        .iter()
        .filter(|n| config.node_refusal(tenant, n).is_some())
        .collect();
    if forbidden.len() == slurm.nodes.len() {
        let t = &config.tenants[tenant];
        let pool = config
            .pool_of(t)
            .map(|p| format!("{} runs on {}", p.owner, p.nodes))
            .unwrap_or_else(|| "every node is in another tenant's pool".into());
        return Err(format!(
            "no node of {} is one tenant '{tenant}' may use ({pool}); ask your admin",
            slurm.path.display()
        ));
    }
    if forbidden.is_empty() {
        return Ok(None);
    }
    let ours = compress(&forbidden);
    Ok(Some(
        match exc_nodes.map(str::trim).filter(|e| !e.is_empty()) {
            Some(user) => format!("{user},{ours}"),
            None => ours,
        },
    ))
}

/// The MCS label that stands for the job's tenant under slurm.conf's MCSPlugin, and the account
/// the job must run under for it (mcs/account); `None`: MCS cannot label tenants here.
fn tenant_label(
    config: &Config,
    resolved: &Resolved,
    who: &Identity,
    account: Option<&str>,
    plugin: &str,
) -> Result<Option<(String, Option<String>)>, String> {
    let tenant = &config.tenants[&resolved.tenant];
    match plugin {
        "label" => Ok(Some((tenant.name.clone(), None))),
        "account" => {
            let accounts = tenant.job_accounts();
            match account {
                None => Ok(Some((accounts[0].clone(), Some(accounts[0].clone())))),
                Some(a) if accounts.iter().any(|x| x == a) => Ok(Some((a.to_string(), None))),
                Some(a) => Err(format!(
                    "tenant '{}' keeps other tenants off its nodes by MCS label, which \
                     mcs/account takes from the job's account, and '{a}' is not one of the \
                     tenant's ({}): submit with --account={}",
                    tenant.name,
                    accounts.join(", "),
                    accounts[0]
                )),
            }
        }
        "group" => Ok(config
            .member_group(who, tenant)
            .map(|g| (g.to_string(), None))),
        _ => Ok(None),
    }
}

/// The MCS part of the placement (`share_node = false`, and every job under `enforced`), or
/// `None` when MCS cannot keep this tenant apart (the caller falls back to `--exclusive`).
pub fn mcs_placement(
    config: &Config,
    resolved: &Resolved,
    who: &Identity,
    account: Option<&str>,
    asked_label: Option<&str>,
    slurm: Option<&SlurmConf>,
) -> Result<Option<Placement>, String> {
    let tier = &config.tiers[&resolved.tier];
    let mcs = slurm.map(SlurmConf::mcs);
    let usable = mcs.as_ref().filter(|m| {
        m.select != McsSelect::Never && matches!(m.plugin.as_str(), "label" | "account" | "group")
    });
    let asked = asked_label.filter(|l| !l.is_empty());
    // Without MCS filtering a label changes nothing for placement (and under mcs/user it is
    // the user's own): not the product's to judge.
    let Some(m) = usable else {
        return Ok(None);
    };
    let wanted = !tier.share_node || m.enforced;
    let label = tenant_label(config, resolved, who, account, &m.plugin)?;
    let refuse_label = |l: &str, ours: Option<&str>| {
        Err(format!(
            "--mcs-label={l}: the job's MCS label is set by the tenancy check to stand for its \
             tenant ('{}'{}); submit without --mcs-label",
            resolved.tenant,
            ours.map(|o| format!(", label {o}")).unwrap_or_default()
        ))
    };
    match (&label, asked) {
        (Some((ours, _)), Some(l)) if l != ours => return refuse_label(l, Some(ours)),
        (None, Some(l)) => return refuse_label(l, None),
        _ => {}
    }
    if !wanted {
        return Ok(Some(Placement::default()));
    }
    let Some((label, account)) = label else {
        return Ok(None);
    };
    Ok(Some(Placement {
        shared_mcs: !tier.share_node && m.select == McsSelect::OnDemand,
        mcs_label: Some(label),
        account,
        ..Placement::default()
    }))
}
