//! The permission model: for one entry, what "others" and each other tenant may do with it
//! (owner, named ACL entries under the mask, group, other), only where they can also reach it.

use crate::{Finding, Rule, TenantMap};
use anyhow::bail;
use rustix::fs::{FileType, Stat};
use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use tenancy_scratch::acl::{
    perm_str, Acl, ACL_GROUP, ACL_GROUP_OBJ, ACL_OTHER, ACL_USER, ACL_USER_OBJ,
};

pub(crate) struct Index {
    names: Vec<String>,
    by_gid: HashMap<u32, usize>,
    by_uid: HashMap<u32, usize>,
    gids: Vec<BTreeSet<u32>>,
    uids: Vec<BTreeSet<u32>>,
}

impl Index {
    pub(crate) fn new(map: &TenantMap) -> anyhow::Result<Index> {
        let mut ix = Index {
            names: vec![],
            by_gid: HashMap::new(),
            by_uid: HashMap::new(),
            gids: vec![],
            uids: vec![],
        };
        for (i, (name, ids)) in map.tenants.iter().enumerate() {
            ix.names.push(name.clone());
            ix.gids.push(ids.gids.clone());
            ix.uids.push(ids.uids.clone());
            for g in &ids.gids {
                if let Some(o) = ix.by_gid.insert(*g, i) {
                    bail!(
                        "gid {g} is mapped to two tenants ({} and {name}); fix the tenant config",
                        map.tenants.keys().nth(o).unwrap()
                    );
                }
            }
            for u in &ids.uids {
                if let Some(o) = ix.by_uid.insert(*u, i) {
                    bail!(
                        "uid {u} is mapped to two tenants ({} and {name}); fix the tenant config",
                        map.tenants.keys().nth(o).unwrap()
                    );
                }
            }
        }
        Ok(ix)
    }
}

/// Who is asking: everyone outside all tenants, or a member of tenant i.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Others,
    Tenant(usize),
}

struct Meta<'a> {
    st: &'a Stat,
    acl: Option<&'a Acl>,
}

fn access(ix: &Index, m: &Meta, who: Who) -> u8 {
    let mode = m.st.st_mode;
    // Linux (fs/namei.c acl_permission_check) consults the ACL only when the group-class bits
    // (the ACL mask) are not all zero; otherwise it falls back to plain owner/group/other bits,
    // so a named entry under an empty mask does not shut its group out of the "other" bits.
    let acl = if mode & 0o070 != 0 { m.acl } else { None };
    let m = &Meta { st: m.st, acl };
    let other = m
        .acl
        .and_then(|a| a.get(ACL_OTHER))
        .unwrap_or((mode & 7) as u8);
    let Who::Tenant(t) = who else { return other };
    if ix.uids[t].contains(&m.st.st_uid) {
        return m
            .acl
            .and_then(|a| a.get(ACL_USER_OBJ))
            .unwrap_or(((mode >> 6) & 7) as u8);
    }
    if let Some(a) = m.acl {
        let mut named = None;
        for e in a.named(ACL_USER) {
            if ix.uids[t].contains(&e.id) {
                named = Some(named.unwrap_or(0) | e.perm);
            }
        }
        if let Some(p) = named {
            return p & a.mask();
        }
    }
    let mut matched = false;
    let mut perms = 0u8;
    if ix.gids[t].contains(&m.st.st_gid) {
        matched = true;
        perms |= m
            .acl
            .and_then(|a| a.get(ACL_GROUP_OBJ))
            .unwrap_or(((mode >> 3) & 7) as u8);
    }
    if let Some(a) = m.acl {
        for e in a.named(ACL_GROUP) {
            if ix.gids[t].contains(&e.id) {
                matched = true;
                perms |= e.perm;
            }
        }
        if matched {
            perms &= a.mask();
        }
    }
    if matched {
        perms
    } else {
        other
    }
}

/// What the walk knows on the way down.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    tenant: Option<usize>,
    tree_root: Option<Arc<PathBuf>>,
    reach_others: bool,
    /// Reachability for tenants whose ids appeared on the way (others fall back to reach_others).
    reach: Vec<(usize, bool)>,
}

impl Ctx {
    pub(crate) fn top() -> Ctx {
        Ctx {
            tenant: None,
            tree_root: None,
            reach_others: true,
            reach: vec![],
        }
    }
    fn reach_of(&self, t: usize) -> bool {
        self.reach
            .iter()
            .find(|(i, _)| *i == t)
            .map(|(_, r)| *r)
            .unwrap_or(self.reach_others)
    }
}

fn tenants_mentioned(ix: &Index, st: &Stat, acl: Option<&Acl>) -> Vec<usize> {
    let mut v = Vec::new();
    if let Some(&t) = ix.by_uid.get(&st.st_uid) {
        v.push(t);
    }
    if let Some(&t) = ix.by_gid.get(&st.st_gid) {
        v.push(t);
    }
    if let Some(a) = acl {
        for e in &a.entries {
            let t = match e.tag {
                ACL_USER => ix.by_uid.get(&e.id),
                ACL_GROUP => ix.by_gid.get(&e.id),
                _ => None,
            };
            if let Some(&t) = t {
                v.push(t);
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

fn who_name(ix: &Index, w: Who) -> String {
    match w {
        Who::Others => "others".into(),
        Who::Tenant(t) => format!("tenant {}", ix.names[t]),
    }
}

pub(crate) fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => out = PathBuf::from("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    out
}

/// Evaluates one entry. Returns the context for its children when it is a directory.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_entry(
    ix: &Index,
    ctx: &Ctx,
    path: &Path,
    st: &Stat,
    acl: Option<&Acl>,
    default_acl: Option<&Acl>,
    link_target: Option<&Path>,
    out: &mut Vec<Finding>,
) -> Option<Ctx> {
    let ft = FileType::from_raw_mode(st.st_mode);
    let is_dir = ft == FileType::Directory;
    let mut tenant = ctx.tenant;
    let mut tree_root = ctx.tree_root.clone();
    if tenant.is_none() && is_dir {
        if let Some(&t) = ix.by_gid.get(&st.st_gid) {
            tenant = Some(t);
            tree_root = Some(Arc::new(path.to_path_buf()));
        }
    }
    let tname = tenant.map(|t| ix.names[t].clone());
    let mut push = |rule: Rule, who: String, perms: String, detail: String| {
        out.push(Finding {
            rule,
            path: path.to_path_buf(),
            tenant: tname.clone(),
            who,
            perms,
            detail,
        });
    };
    let mentioned = tenants_mentioned(ix, st, acl);
    let meta = Meta { st, acl };
    let mode = st.st_mode & 0o7777;
    if ft == FileType::Symlink {
        if let (Some(root), Some(target)) = (&tree_root, link_target) {
            let base = path.parent().unwrap_or(Path::new("/"));
            let resolved = normalize(&base.join(target));
            if !resolved.starts_with(root.as_path()) {
                push(
                    Rule::SymlinkOutOfTree,
                    String::new(),
                    String::new(),
                    format!("-> {} (tree {})", target.display(), root.display()),
                );
            }
        }
        return None;
    }
    if let Some(t) = tenant {
        tenant_findings(ix, ctx, t, &meta, default_acl, &mentioned, &mut push);
    }
    if is_dir && mode & 0o002 != 0 && mode & 0o1000 == 0 && ctx.reach_others {
        push(
            Rule::WorldWritableNoSticky,
            "others".into(),
            perm_str((mode & 7) as u8),
            format!("mode {mode:04o}"),
        );
    }
    if ft == FileType::RegularFile && mode & 0o6000 != 0 {
        let kind = if mode & 0o4000 != 0 {
            "setuid"
        } else {
            "setgid"
        };
        push(
            Rule::SetId,
            String::new(),
            String::new(),
            format!("{kind} mode {mode:04o}, owner {}:{}", st.st_uid, st.st_gid),
        );
    }
    if !is_dir {
        return None;
    }
    let x = |w| access(ix, &meta, w) & 1 != 0;
    let mut reach = Vec::new();
    for i in ctx
        .reach
        .iter()
        .map(|(i, _)| *i)
        .chain(mentioned.iter().copied())
    {
        if reach.iter().any(|(j, _)| *j == i) {
            continue;
        }
        reach.push((i, ctx.reach_of(i) && x(Who::Tenant(i))));
    }
    Some(Ctx {
        tenant,
        tree_root,
        reach_others: ctx.reach_others && x(Who::Others),
        reach,
    })
}

/// In tenant `t`'s tree: who else may use the entry (others, the tenants it mentions or that
/// reach it), a group or owner of another tenant, and default ACL entries granting another.
fn tenant_findings(
    ix: &Index,
    ctx: &Ctx,
    t: usize,
    meta: &Meta,
    default_acl: Option<&Acl>,
    mentioned: &[usize],
    push: &mut dyn FnMut(Rule, String, String, String),
) {
    let (st, acl) = (meta.st, meta.acl);
    let mode = st.st_mode & 0o7777;
    let mut whos = vec![Who::Others];
    whos.extend(
        mentioned
            .iter()
            .copied()
            .chain(ctx.reach.iter().map(|(i, _)| *i))
            .filter(|&i| i != t)
            .map(Who::Tenant),
    );
    whos.dedup();
    let mut seen = Vec::new();
    for w in whos {
        if seen.contains(&w) {
            continue;
        }
        seen.push(w);
        let reach = match w {
            Who::Others => ctx.reach_others,
            Who::Tenant(i) => ctx.reach_of(i),
        };
        let p = access(ix, meta, w);
        if reach && p != 0 {
            let how = if acl.is_some() {
                format!("mode {mode:04o} + ACL")
            } else {
                format!("mode {mode:04o}")
            };
            push(
                Rule::Exposed,
                who_name(ix, w),
                perm_str(p),
                format!("{how}, owner {}:{}", st.st_uid, st.st_gid),
            );
        }
    }
    if let Some(&g) = ix.by_gid.get(&st.st_gid) {
        if g != t {
            push(
                Rule::ForeignGroup,
                who_name(ix, Who::Tenant(g)),
                String::new(),
                format!("group {} belongs to tenant {}", st.st_gid, ix.names[g]),
            );
        }
    }
    if let Some(&u) = ix.by_uid.get(&st.st_uid) {
        if u != t {
            push(
                Rule::ForeignOwner,
                who_name(ix, Who::Tenant(u)),
                String::new(),
                format!("owner {} belongs to tenant {}", st.st_uid, ix.names[u]),
            );
        }
    }
    if let Some(d) = default_acl {
        for e in &d.entries {
            let (kind, owner) = match e.tag {
                ACL_USER => ("user", ix.by_uid.get(&e.id)),
                ACL_GROUP => ("group", ix.by_gid.get(&e.id)),
                _ => continue,
            };
            if let Some(&o) = owner {
                if o != t && e.perm != 0 {
                    push(
                        Rule::DefaultAclGrant,
                        who_name(ix, Who::Tenant(o)),
                        perm_str(e.perm),
                        format!("default:{kind}:{}:{}", e.id, perm_str(e.perm)),
                    );
                }
            }
        }
    }
}
