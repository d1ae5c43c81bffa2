//! Which tenant a job runs for: decided from the job's user, its groups (primary and
//! supplementary, from NSS), its Slurm account and what the user asked for.
//!
//! Group membership is the proof; an account only selects among the tenants a user belongs to,
//! since users can name any account where Slurm does not enforce associations.

use crate::{valid_name, valid_profile, Config, Tenant};
use nix::unistd::{getgrouplist, Gid, Group, Uid, User};
use std::ffi::CString;
use std::fmt;
use std::sync::OnceLock;

/// A job's user as NSS sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub user: String,
    /// The primary group (passwd).
    pub gid: u32,
    /// Primary and supplementary groups (getgrouplist), listed on first need: it walks every
    /// NSS source (with `systemd` in nsswitch.conf that loads a module: 0.4 ms, most of a
    /// prolog's identity check), while a tenant's group entry usually answers alone.
    listed: OnceLock<Result<Vec<u32>, String>>,
}

impl Identity {
    /// Looks the user up in NSS (passwd); the group list follows when needed.
    pub fn from_uid(uid: u32) -> Result<Identity, String> {
        let user = User::from_uid(Uid::from_raw(uid))
            .map_err(|e| format!("cannot look up uid {uid} in NSS: {e}"))?
            .ok_or_else(|| {
                format!("uid {uid} has no passwd entry (check NSS/sssd on this node)")
            })?;
        Ok(Identity {
            uid,
            user: user.name,
            gid: user.gid.as_raw(),
            listed: OnceLock::new(),
        })
    }

    /// A user whose groups are known already (the first one is the primary group).
    pub fn with_groups(uid: u32, user: &str, gids: Vec<u32>) -> Identity {
        Identity {
            uid,
            user: user.to_string(),
            gid: gids.first().copied().unwrap_or(u32::MAX),
            listed: OnceLock::from(Ok(gids)),
        }
    }

    /// Primary and supplementary groups, from NSS.
    pub fn gids(&self) -> Result<&[u32], String> {
        self.listed
            .get_or_init(|| {
                let name = CString::new(self.user.clone()).map_err(|e| e.to_string())?;
                getgrouplist(&name, Gid::from_raw(self.gid))
                    .map(|g| g.into_iter().map(Gid::as_raw).collect())
                    .map_err(|e| format!("cannot list the groups of user {}: {e}", self.user))
            })
            .as_deref()
            .map_err(Clone::clone)
    }

    /// Is the user in `group`? Its primary group, or the group's own member list, answers
    /// without listing all of the user's groups; otherwise the full list decides (a source
    /// may return a group without members, e.g. sssd with `ignore_group_members`). A list that
    /// cannot be had counts as "not a member": fail closed.
    pub fn in_group(&self, group: &Group) -> bool {
        let gid = group.gid.as_raw();
        gid == self.gid
            || group.mem.contains(&self.user)
            || self.gids().is_ok_and(|g| g.contains(&gid))
    }
}

/// The uid of a user name, if NSS knows it.
pub fn user_uid(name: &str) -> Option<u32> {
    User::from_name(name).ok().flatten().map(|u| u.uid.as_raw())
}

/// The gid of a group name, if NSS knows it.
pub fn group_gid(name: &str) -> Option<u32> {
    Group::from_name(name)
        .ok()
        .flatten()
        .map(|g| g.gid.as_raw())
}

/// Every user NSS lists in a passwd enumeration: (uid, primary gid). Sources that do not
/// enumerate (sssd without `enumerate = true`, most LDAP set-ups) add nothing here.
pub fn enumerate_users() -> Vec<(u32, u32)> {
    let mut users = Vec::new();
    // SAFETY: getpwent's static buffer is read before the next call; setpwent/endpwent bracket
    // the walk. Called from one thread (a command's main thread).
    unsafe {
        libc::setpwent();
        loop {
            let pw = libc::getpwent();
            if pw.is_null() {
                break;
            }
            users.push(((*pw).pw_uid, (*pw).pw_gid));
        }
        libc::endpwent();
    }
    users
}

impl Config {
    /// The uids of each tenant's members as NSS knows them: the users whose primary group is
    /// one of the tenant's groups (from a passwd enumeration) and those in a tenant group's
    /// member list. A user can be in several tenants.
    pub fn member_uids(
        &self,
    ) -> std::collections::BTreeMap<String, std::collections::BTreeSet<u32>> {
        let users = enumerate_users();
        self.tenants
            .values()
            .map(|t| {
                let mut uids = std::collections::BTreeSet::new();
                for name in &t.groups {
                    let Ok(Some(group)) = Group::from_name(name) else {
                        continue;
                    };
                    let gid = group.gid.as_raw();
                    uids.extend(users.iter().filter(|(_, g)| *g == gid).map(|(u, _)| *u));
                    for member in &group.mem {
                        if let Ok(Some(u)) = User::from_name(member) {
                            uids.insert(u.uid.as_raw());
                        }
                    }
                }
                (t.name.clone(), uids)
            })
            .collect()
    }
}

/// The tenant, tier and MIG profile a job gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub tenant: String,
    pub tier: String,
    pub profile: Option<String>,
    /// The gid of the tenant's first group NSS knows, found while checking membership.
    pub tenant_gid: Option<u32>,
}

/// A precise reason why a job may not run; Display is one line for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    BadTenantName(String),
    UnknownTenant {
        tenant: String,
        known: Vec<String>,
    },
    NotMember {
        user: String,
        tenant: String,
        groups: Vec<String>,
    },
    NoTenant {
        user: String,
        choices: Vec<(String, Vec<String>)>,
    },
    SeveralTenants {
        user: String,
        tenants: Vec<String>,
    },
    AccountMismatch {
        account: String,
        owner: String,
        tenant: String,
    },
    BadProfile(String),
    ProfileNotAllowed {
        tenant: String,
        tier: String,
        profile: String,
        allowed: Vec<String>,
    },
}

fn groups_phrase(groups: &[String]) -> String {
    match groups {
        [one] => format!("group {one}"),
        many => format!("one of the groups {}", many.join(", ")),
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::BadTenantName(n) => write!(
                f,
                "'{}' is not a tenant name (lowercase letters, digits, '-' and '_', at most 32)",
                n.escape_default()
            ),
            Refusal::UnknownTenant { tenant, known } => write!(
                f,
                "unknown tenant '{tenant}' (tenants on this cluster: {})",
                known.join(", ")
            ),
            Refusal::NotMember { user, tenant, groups } => write!(
                f,
                "user {user} is not a member of tenant '{tenant}' (members need {})",
                groups_phrase(groups)
            ),
            Refusal::NoTenant { user, choices } => {
                write!(f, "user {user} is not a member of any tenant (")?;
                for (i, (t, g)) in choices.iter().enumerate() {
                    if i > 0 {
                        write!(f, "; ")?;
                    }
                    write!(f, "{t} needs {}", groups_phrase(g))?;
                }
                write!(f, ")")
            }
            Refusal::SeveralTenants { user, tenants } => write!(
                f,
                "user {user} is a member of several tenants ({}): choose one with --tenant",
                tenants.join(", ")
            ),
            Refusal::AccountMismatch { account, owner, tenant } => write!(
                f,
                "account '{account}' belongs to tenant '{owner}', not '{tenant}': \
                 submit with --account of tenant '{tenant}' or --tenant={owner}"
            ),
            Refusal::BadProfile(p) => write!(
                f,
                "'{}' is not a MIG profile (write it as NVML names it, e.g. 1g.18gb)",
                p.escape_default()
            ),
            Refusal::ProfileNotAllowed { tenant, tier, profile, allowed } => write!(
                f,
                "MIG profile '{profile}' is not allowed for tenant '{tenant}' (tier {tier} allows {})",
                if allowed.is_empty() { "no MIG slices".to_string() } else { allowed.join(", ") }
            ),
        }
    }
}

impl Config {
    /// Is `who` a member of `tenant` through one of its groups?
    pub fn is_member(&self, who: &Identity, tenant: &Tenant) -> bool {
        self.membership(who, tenant).0
    }

    /// Whether `who` is in one of the tenant's groups, and the gid of the first of them NSS
    /// knows (the tenant's group on this node). Each group is looked up once, in order, up to
    /// the first that has `who`: with sssd or LDAP every lookup can be a round trip.
    fn membership(&self, who: &Identity, tenant: &Tenant) -> (bool, Option<u32>) {
        let mut first_gid = None;
        for name in &tenant.groups {
            if let Ok(Some(group)) = Group::from_name(name) {
                first_gid.get_or_insert(group.gid.as_raw());
                if who.in_group(&group) {
                    return (true, first_gid);
                }
            }
        }
        (false, first_gid)
    }

    /// The first of the tenant's groups `who` is in (the tenant's MCS label under mcs/group).
    pub fn member_group<'a>(&self, who: &Identity, tenant: &'a Tenant) -> Option<&'a str> {
        tenant
            .groups
            .iter()
            .find(|name| {
                Group::from_name(name)
                    .ok()
                    .flatten()
                    .is_some_and(|g| who.in_group(&g))
            })
            .map(String::as_str)
    }

    /// The tenant an account maps to.
    pub fn tenant_of_account(&self, account: &str) -> Option<&Tenant> {
        self.tenants
            .values()
            .find(|t| t.accounts.iter().any(|a| a == account))
    }

    /// Decides the tenant, tier and profile of a job, or says precisely why not.
    pub fn resolve(
        &self,
        who: &Identity,
        account: Option<&str>,
        requested_tenant: Option<&str>,
        requested_profile: Option<&str>,
    ) -> Result<Resolved, Refusal> {
        let by_account = account.and_then(|a| self.tenant_of_account(a));
        let (tenant, tenant_gid) = match requested_tenant {
            Some(name) => {
                if !valid_name(name) {
                    return Err(Refusal::BadTenantName(name.to_string()));
                }
                let Some(t) = self.tenants.get(name) else {
                    return Err(Refusal::UnknownTenant {
                        tenant: name.to_string(),
                        known: self.tenants.keys().cloned().collect(),
                    });
                };
                let (member, gid) = self.membership(who, t);
                if !member {
                    return Err(Refusal::NotMember {
                        user: who.user.clone(),
                        tenant: t.name.clone(),
                        groups: t.groups.clone(),
                    });
                }
                if let Some(owner) = by_account.filter(|o| o.name != t.name) {
                    return Err(Refusal::AccountMismatch {
                        account: account.unwrap_or_default().to_string(),
                        owner: owner.name.clone(),
                        tenant: t.name.clone(),
                    });
                }
                (t, gid)
            }
            None => {
                let mine: Vec<(&Tenant, Option<u32>)> = self
                    .tenants
                    .values()
                    .filter_map(|t| match self.membership(who, t) {
                        (true, gid) => Some((t, gid)),
                        (false, _) => None,
                    })
                    .collect();
                match (by_account, mine.as_slice()) {
                    (Some(t), _) => match mine.iter().find(|(m, _)| m.name == t.name) {
                        Some(&(_, gid)) => (t, gid),
                        None => {
                            return Err(Refusal::NotMember {
                                user: who.user.clone(),
                                tenant: t.name.clone(),
                                groups: t.groups.clone(),
                            })
                        }
                    },
                    (None, [one]) => *one,
                    (None, []) => {
                        return Err(Refusal::NoTenant {
                            user: who.user.clone(),
                            choices: self
                                .tenants
                                .values()
                                .map(|t| (t.name.clone(), t.groups.clone()))
                                .collect(),
                        })
                    }
                    (None, many) => {
                        return Err(Refusal::SeveralTenants {
                            user: who.user.clone(),
                            tenants: many.iter().map(|(t, _)| t.name.clone()).collect(),
                        })
                    }
                }
            }
        };
        let tier = self.tier_of(tenant);
        let profile = match requested_profile.filter(|p| !p.is_empty()) {
            None => None,
            Some(p) if !valid_profile(p) => return Err(Refusal::BadProfile(p.to_string())),
            Some(p) if !tier.mig_profiles.iter().any(|a| a == p) => {
                return Err(Refusal::ProfileNotAllowed {
                    tenant: tenant.name.clone(),
                    tier: tier.name.clone(),
                    profile: p.to_string(),
                    allowed: tier.mig_profiles.clone(),
                })
            }
            Some(p) => Some(p.to_string()),
        };
        Ok(Resolved {
            tenant: tenant.name.clone(),
            tier: tier.name.clone(),
            profile,
            tenant_gid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    fn group(gid: u32, members: &[&str]) -> Group {
        Group {
            name: format!("g{gid}"),
            passwd: CString::new("x").unwrap(),
            gid: Gid::from_raw(gid),
            mem: members.iter().map(|m| m.to_string()).collect(),
        }
    }

    #[test]
    fn membership_is_answered_by_the_group_before_listing_every_group() {
        let root = Identity::from_uid(0).unwrap();
        // The primary group and a group naming the user need no getgrouplist.
        assert!(root.in_group(&group(0, &[])));
        assert!(root.in_group(&group(3_999_000, &["daemon", "root"])));
        assert!(root.listed.get().is_none());
        // Anything else asks for the full list, which decides.
        assert!(!root.in_group(&group(3_999_001, &["daemon"])));
        assert!(root.listed.get().is_some());
        assert!(root.gids().unwrap().contains(&0));
        // A known list is authoritative for groups that do not name the user.
        let u = Identity::with_groups(4242, "u4242", vec![7, 8]);
        assert!(u.in_group(&group(8, &[])));
        assert!(!u.in_group(&group(9, &["someone"])));
    }
}
