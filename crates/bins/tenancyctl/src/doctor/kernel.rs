//! Kernel settings the isolation relies on: Yama's ptrace restriction.

use super::{row, Row};
use tenancy_devices::doctor::Severity;

const YAMA_PTRACE_SCOPE: &str = "/proc/sys/kernel/yama/ptrace_scope";

/// A user may belong to two tenants and run a job of each on one node, under one uid: without
/// Yama's ptrace restriction, a process of one job can ptrace the other or take its sockets and
/// files (`pidfd_getfd`), and so use the other tenant's device slice, egress and scratch.
/// `scope`: the content of [`YAMA_PTRACE_SCOPE`], None when Yama is not in the kernel.
fn ptrace_row(scope: Option<&str>) -> Row {
    let remedy = Some(
        "`sysctl kernel.yama.ptrace_scope=1` (in /etc/sysctl.d/), or a kernel with Yama \
         (CONFIG_SECURITY_YAMA); or keep users who belong to several tenants off shared nodes"
            .to_string(),
    );
    let why = "a user in two tenants with a job of each on this node can reach one job's \
               processes from the other (ptrace, pidfd_getfd: its sockets, device files and \
               scratch), across the tenants' isolation";
    match scope.map(str::trim) {
        Some(v) if v.parse::<u32>().is_ok_and(|n| n >= 1) => row(
            "node.ptrace_scope",
            Severity::Ok,
            format!("Yama ptrace_scope is {v}: a job's processes cannot attach to another job's"),
            None,
        ),
        Some(v) => row(
            "node.ptrace_scope",
            Severity::Warn,
            format!("Yama ptrace_scope is {v}: {why}"),
            remedy,
        ),
        None => row(
            "node.ptrace_scope",
            Severity::Warn,
            format!("the kernel has no Yama ({YAMA_PTRACE_SCOPE} is missing): {why}"),
            remedy,
        ),
    }
}

/// Kernel settings the isolation relies on.
pub(super) fn kernel_rows(rows: &mut Vec<Row>) {
    rows.push(ptrace_row(
        std::fs::read_to_string(YAMA_PTRACE_SCOPE).ok().as_deref(),
    ));
    rows.push(abstract_sockets_row(
        tenancy_job::abstract_sockets::kernel_abi(),
    ));
}

/// Abstract UNIX sockets (a name, no file: outside file permissions, cgroups and nft) between
/// jobs: closed where the kernel's Landlock scopes them (ABI 6, Linux 6.12), open otherwise.
/// `abi`: the kernel's Landlock ABI, None without Landlock.
fn abstract_sockets_row(abi: Option<i32>) -> Row {
    let check = "containment.abstract_sockets";
    let need = tenancy_job::abstract_sockets::SCOPING_ABI;
    match abi {
        Some(v) if v >= need => row(
            check,
            Severity::Ok,
            format!(
                "Landlock ABI {v} scopes abstract UNIX sockets: each step's processes reach only the abstract sockets their own step made (not another job's, another step's or the node's)"
            ),
            None,
        ),
        found => row(
            check,
            Severity::Warn,
            format!(
                "{}: a job can connect to an abstract UNIX socket another tenant's job listens on (docs/known-gaps.md)",
                match found {
                    Some(v) => format!("Landlock ABI {v} cannot scope abstract UNIX sockets (ABI {need}, Linux 6.12, can)"),
                    None => "the kernel has no Landlock (CONFIG_SECURITY_LANDLOCK, lsm=)".into(),
                }
            ),
            Some(
                "Linux 6.12 or later with Landlock enabled; or keep tenants on nodes of their own (share_node = false)"
                    .into(),
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{abstract_sockets_row, ptrace_row};

    #[test]
    fn a_node_without_yama_ptrace_restriction_is_warned_about() {
        assert_eq!(ptrace_row(Some("1\n")).severity, "ok");
        assert_eq!(ptrace_row(Some("3")).severity, "ok");
        let zero = ptrace_row(Some("0\n"));
        assert_eq!(zero.severity, "warn");
        assert!(zero.message.contains("pidfd_getfd"), "{}", zero.message);
        let none = ptrace_row(None);
        assert_eq!(none.severity, "warn");
        assert!(none.message.contains("no Yama"), "{}", none.message);
    }

    /// Abstract UNIX sockets: closed with Landlock ABI 6 or later, the gap named otherwise.
    #[test]
    fn abstract_sockets_follow_the_kernels_landlock_abi() {
        assert_eq!(abstract_sockets_row(Some(6)).severity, "ok");
        assert_eq!(abstract_sockets_row(Some(7)).severity, "ok");
        let old = abstract_sockets_row(Some(5));
        assert_eq!(old.severity, "warn");
        assert!(old.message.contains("Landlock ABI 5"), "{}", old.message);
        let none = abstract_sockets_row(None);
        assert_eq!(none.severity, "warn");
        assert!(none.message.contains("no Landlock"), "{}", none.message);
    }
}
