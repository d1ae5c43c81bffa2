# After two_jobs.sh, on a node without PrologFlags=Contain (job_folder_recreated_by_slurm_
# keeps_the_isolation): every step of globex's job is its last running one, which Slurm's
# cgroup/v2 plugin follows by removing the job folder; two steps, the folder between them.
probe $G_USER $g step1
steps_gone
echo "folder_between=$(folder)" >>$RES
probe $G_USER $g step2
end_two_jobs
