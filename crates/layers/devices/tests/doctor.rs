//! doctor on this machine (root: the BPF probe loads a program).

mod common;
use common::*;
use tenancy_devices::doctor::{doctor, DoctorParams, Severity};

#[test]
fn doctor_on_this_node() {
    if !requires_root("doctor_on_this_node") {
        return;
    }
    let fx = Fixture::new();
    let findings = doctor(&DoctorParams {
        driver: fx.driver(),
        slurm_cgroup_conf: fx.path("no-such-cgroup.conf"),
        ..Default::default()
    });
    let get = |c: &str| {
        findings
            .iter()
            .find(|f| f.check == c)
            .unwrap_or_else(|| panic!("{c}: {findings:?}"))
    };
    assert_eq!(get("bpf.syscall").severity, Severity::Ok, "{findings:?}");
    assert_eq!(get("devices.backend").severity, Severity::Ok);
    assert_eq!(get("devices.selfcheck").severity, Severity::Ok);
    assert_eq!(get("nvidia.driver").severity, Severity::Ok);
    let table =
        tenancy_devices::cli::render(&findings, tenancy_devices::cli::Format::Table).unwrap();
    assert!(table.contains("bpf.syscall"));
    let csv = tenancy_devices::cli::render(&findings, tenancy_devices::cli::Format::Csv).unwrap();
    assert!(csv.starts_with("check,severity,message,remedy\n"));
}
