# Same grouping as `tenancyctl report --by tenant,profile`, streaming (reduce inputs), pairing
# job_end to job_start by cluster/node/job_id when job_end lacks started/profile/slices.
# Written for speed: updates never bind the whole accumulator (jq's `a += b` does, which
# copies the state on every record).
def ms: (.[0:19] + "Z" | fromdate) * 1000 + (.[20:23] | tonumber);
def bump($k; f): .g[$k] = ((.g[$k] // {}) | f);
reduce inputs as $r ({g: {}, open: {}};
  ($r.tenant // "-") as $t
  | if $r.event == "job_start" then
      (if $r.outcome == "success" then
         .open["\($r.cluster)/\($r.node)/\($r.job_id)"] = {s: ($r.time | ms), p: $r.profile, c: $r.compute_slices}
         | bump("\($t),\($r.profile // "-")"; .jobs += 1)
       else . end)
    elif $r.event == "job_end" then
      "\($r.cluster)/\($r.node)/\($r.job_id)" as $k
      | .open[$k] as $o
      | ($r.time | ms) as $e
      | (if $r.started then ($r.started | ms) else ($o.s // $e) end) as $s
      | ($r.profile // $o.p // "-") as $p
      | ($r.compute_slices // $o.c // 0) as $c
      | ($r.firewall_drops // 0) as $drops
      | del(.open[$k])
      | bump("\($t),\($p)"; .ends += 1 | .ms += ($e - $s) | .cms += (($e - $s) * $c) | .drops += $drops)
    elif $r.event == "job_denied" then bump("\($t),\($r.profile // "-")"; .denied += 1)
    elif $r.event == "rollback" then bump("\($t),\($r.profile // "-")"; .rollbacks += 1)
    elif $r.event == "teardown_failed" then bump("\($t),\($r.profile // "-")"; .teardown += 1)
    else . end)
| .g | to_entries | sort_by(.key)[]
| "\(.key),\(.value.jobs // 0),\(.value.ends // 0),\((.value.ms // 0) / 3600000 * 1000 | round / 1000),\((.value.cms // 0) / 3600000 * 1000 | round / 1000),\(.value.denied // 0),\(.value.rollbacks // 0),\(.value.teardown // 0),\(.value.drops // 0)"
