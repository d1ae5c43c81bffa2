# After two_jobs.sh, with Contain (job_folder_recreated_by_slurm_keeps_the_isolation): globex's
# user ends their own extern step, then runs a step; then root removes the keeper (nothing of
# the product does that), a step lets Slurm remove the folder, and the next step finds it made
# again.
probe $G_USER $g step1
as $G_USER scancel -s KILL $g.4294967292; echo "kill_rc=$?" >>$RES
i=0; while [ -d $F/step_extern ] && [ $i -lt 120 ]; do i=$((i + 1)); sleep 0.5; done
sleep 1; echo "extern_left=$([ -d $F/step_extern ] && echo yes || echo no)" >>$RES
echo "folder_after_kill=$(folder)" >>$RES
probe $G_USER $g step2
rmdir $F/tenancy-keeper; echo "keeper_rm_rc=$?" >>$RES
as $G_USER timeout 120 srun --jobid=$g -n1 -N1 true; steps_gone
echo "folder_unkept=$(folder)" >>$RES
probe $G_USER $g step4
end_two_jobs
