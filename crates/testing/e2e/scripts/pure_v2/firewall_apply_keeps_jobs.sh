# After two_jobs.sh (firewall_apply_keeps_running_jobs_isolated): `tenancyctl firewall apply`
# while both jobs run; the jobs maps' elements before and after, what apply says it kept, and
# globex's and acme's steps after it.
elems() { nft list map inet tenancy jobs_out | grep -o goto | wc -l; }
probe $G_USER $g before
echo "elements_before=$(elems)" >>$RES
$W/bin/tenancyctl --config /tmp/slurm/tenancy.toml firewall apply >$J/apply.out 2>&1
echo "apply_rc=$?" >>$RES
echo "apply_kept=$(sed -n 's/^running jobs kept in the jobs maps: //p' $J/apply.out)" >>$RES
echo "elements_after=$(elems)" >>$RES
probe $G_USER $g after
probe $A_USER $a own_after
end_two_jobs
