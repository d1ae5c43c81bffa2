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
}

#[cfg(test)]
mod tests {
    use super::ptrace_row;

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
}
