# The product on the pure cgroup v2 node, as on a real node (PureV2Node, before Slurm starts):
# its folders on the node's tmpfs, the anchor key, the NVML stand-in with its fixture, the
# config and the SPANK plugin's plugstack line, the device nodes laid out, the firewall applied.
# The programs and the files the test wrote are in $W/bin and $W (init.sh's folder).
set -e
T=/tmp/tenancy
mkdir -p $T/state $T/audit $T/scratch $T/lib $T/nvml $T/dev $T/bin
chmod 755 $T $T/scratch $T/lib $T/nvml $T/dev
head -c 32 /dev/urandom >$T/audit/anchor.key
chmod 600 $T/audit/anchor.key
cp $W/bin/libnvidia_ml.so $T/lib/libnvidia-ml.so.1
cp $W/fixture.toml $T/nvml/fixture.toml
cp $W/tenancy.toml /tmp/slurm/tenancy.toml
chmod 644 /tmp/slurm/tenancy.toml
echo "required $W/bin/libspank_tenancy.so config=/tmp/slurm/tenancy.toml" >/tmp/slurm/plugstack.conf
NVML_SHIM_FIXTURE=$T/nvml/fixture.toml $W/bin/nvml-shim-ctl layout
$W/bin/tenancyctl --config /tmp/slurm/tenancy.toml firewall apply
