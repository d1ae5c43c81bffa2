# One node of the multi-node cluster (multi_node.rs), `sh -ec` of this text in new UTS and mount
# namespaces: NAME CGROUP ROOT NODE_DIR HOSTS: the node's host name, its own cgroup2 tree, its
# own product state in the config's folder (with what is mounted below it: the soak's audit
# disk) and /etc/hosts with the nodes. It then holds the node's namespaces (its slurmd is
# started into them, and can be killed and started again, as across a reboot).
hostname "$1"
mount --bind "$2" /sys/fs/cgroup/unified
mount --rbind "$3" "$4"
mount --bind "$5" /etc/hosts
exec sleep infinity
