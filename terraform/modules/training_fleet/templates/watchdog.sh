#!/bin/bash
# srifty watchdog: the fleet stops itself when nobody is watching it any more (lightning-srifty, training_fleet).
#
# Started in the background by user_data before anything else. Every SRIFTY_WD_INTERVAL_S seconds (a bounded loop)
# it stops the instance when
#   - the boot script has ended or the training job has exited (fleet self-termination after the job), or
#   - the instance's life cap has passed (SRIFTY_WD_LIFE_UNTIL, unix seconds), or
#   - with a heartbeat (SRIFTY_WD_HEARTBEAT_URI, written by `srifty launch` every ~30 s): the record is older than
#     its max_age_s, now is past its max_life_until_unix, or no record could be read for SRIFTY_WD_MAX_AGE_S.
# Stopping: SIGTERM to the job (it checkpoints and exits 75), SRIFTY_WD_GRACE_S seconds to do so, SIGKILL, then (asg
# mode) the group's launches are suspended and the instance leaves it with the desired capacity decremented so that
# nothing replaces it, then (after the boot script's status record, bounded) `shutdown -h now`: the launch template's
# instance_initiated_shutdown_behavior is terminate. A job that left by itself on a spot notice with a checkpoint (the
# marker "preempted" in the state folder) on a fleet no launcher watches (no heartbeat) stays in its group instead:
# the group starts a replacement, which resumes. A stop the watchdog makes (the life cap, the heartbeat) is never
# that: the job checkpoints on its SIGTERM and marks it as on a notice, and the fleet had restarted itself for as long
# as the job had work (a review); the watchdog writes why in "watchdog.stop" first, which user_data reports.
#
# Settings (environment): SRIFTY_WD_STATE_DIR (job.pid and user_data.exited are written there by user_data),
# SRIFTY_WD_REGION, SRIFTY_WD_INTERVAL_S, SRIFTY_WD_GRACE_S, SRIFTY_WD_LIFE_UNTIL, SRIFTY_WD_HEARTBEAT_URI (empty:
# no heartbeat), SRIFTY_WD_MAX_AGE_S, SRIFTY_WD_ASG (1: leave the Auto Scaling group first), SRIFTY_WD_INSTANCE_ID.
set -uo pipefail

STATE="${SRIFTY_WD_STATE_DIR:?}"
INTERVAL="${SRIFTY_WD_INTERVAL_S:-60}"
GRACE="${SRIFTY_WD_GRACE_S:-120}"
LIFE_UNTIL="${SRIFTY_WD_LIFE_UNTIL:?}"
HEARTBEAT="${SRIFTY_WD_HEARTBEAT_URI:-}"
DEFAULT_MAX_AGE="${SRIFTY_WD_MAX_AGE_S:-300}"
REGION="${SRIFTY_WD_REGION:-us-east-1}"

log() { echo "srifty-watchdog $(date -u +%FT%TZ): $*"; }

# the fleet's life record (SRIFTY_WD_LIFE_URI, written by user_data at boot): a stop that ends the fleet (not a spot
# notice) says when and why in it before the job is stopped, so that the other nodes, whose jobs leave with a
# checkpoint as on a notice, leave their groups too, and a replacement launched before it ends itself
LIFE_URI="${SRIFTY_WD_LIFE_URI:-}"
end_life() {
  [ -n "$LIFE_URI" ] || return 0
  local now
  now=$(date +%s)
  # an end already recorded is kept (the first node's reason); the born time is the record's own
  timeout 30 aws s3 cp "$LIFE_URI" - --region "$REGION" --only-show-errors 2>/dev/null |
    python3 -c '
import json, sys
try:
    r = json.load(sys.stdin)
except ValueError:
    r = {}
if r.get("ended_unix") is not None:
    sys.exit(3)
fleet, born, now, by, why = sys.argv[1:6]
print(json.dumps({"fleet": fleet, "born_unix": int(r.get("born_unix") or born), "born_by": r.get("born_by"),
                  "ended_unix": int(now), "ended_by": by, "why": why[:300]}))
' "${SRIFTY_WD_FLEET:-}" "${SRIFTY_WD_BORN:-$now}" "$now" "${SRIFTY_WD_INSTANCE_ID:-}" "$1" >"$STATE/life.ended"
  case "${PIPESTATUS[1]}" in
    0) timeout 30 aws s3 cp "$STATE/life.ended" "$LIFE_URI" --region "$REGION" --only-show-errors &&
      log "the fleet's life ended: $1 ($LIFE_URI)" || log "could not record the fleet's end at $LIFE_URI" ;;
    3) log "the fleet's life had already ended ($LIFE_URI)" ;;
    *) log "could not record the fleet's end at $LIFE_URI" ;;
  esac
}

for v in "$INTERVAL" "$GRACE" "$LIFE_UNTIL" "$DEFAULT_MAX_AGE"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { log "bad setting '$v' (whole seconds expected): stopping now"; LIFE_UNTIL=0; }
done
[[ "$INTERVAL" =~ ^[1-9][0-9]*$ ]] || INTERVAL=60
[[ "$GRACE" =~ ^[0-9]+$ ]] || GRACE=120
[[ "$DEFAULT_MAX_AGE" =~ ^[0-9]+$ ]] || DEFAULT_MAX_AGE=300

job_pid() { [ -s "$STATE/job.pid" ] && tr -cd '0-9' <"$STATE/job.pid"; }

job_gone() {
  [ -e "$STATE/user_data.exited" ] && return 0
  local pid
  pid=$(job_pid) || return 1
  [ -n "$pid" ] || return 1
  ! kill -0 "$pid" 2>/dev/null && return 0
  # a job that has exited but not been reaped yet (a zombie) has exited too
  [ "$(sed -e 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" = Z ]
}

# prints "written_unix max_age_s max_life_until_unix" of the heartbeat record, or fails
read_heartbeat() {
  aws s3 cp "$HEARTBEAT" - --region "$REGION" --only-show-errors 2>/dev/null | python3 -c '
import json, math, sys
r = json.load(sys.stdin)
w, a, u = r["written_unix"], r.get("max_age_s"), r.get("max_life_until_unix")
ok = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
if not ok(w) or (a is not None and not ok(a)) or (u is not None and not ok(u)):
    sys.exit(1)
print(int(w), int(a) if a is not None else "-", int(u) if u is not None else "-")
'
}

# whether the boot script is still within the deadline of its verdict on a failed job (verdict.until, unix seconds)
deciding() {
  local until
  until=$(tr -cd '0-9' 2>/dev/null <"$STATE/verdict.until")
  [ -n "$until" ] && [ "$(date +%s)" -lt $((until + 150)) ]
}

# stop_instance REASON [exited]: "exited" when the job ended by itself (not stopped here)
stop_instance() {
  log "stopping: $1"
  local pid
  pid=$(job_pid)
  if [ "${2:-}" != exited ]; then echo "$1" >"$STATE/watchdog.stop"; fi
  # a job that left on a spot notice with its checkpoint (its marker, no stop of the watchdog's or another node's):
  # the fleet goes on (a replacement, or the launcher's next fleet); every other stop ends the fleet's life
  local notice=0 waited=0 boot
  # the boot script decides what the job's exit was (a notice, or the fleet stopped by another node): while it runs,
  # its verdict first (bounded: 60 s, or on a fleet of several nodes, whose failed job first asks whether a peer was
  # lost without a notice, until the deadline it wrote in verdict.until and 150 s for its last round's calls, the
  # life record's read and its exit record)
  boot=$(tr -cd '0-9' 2>/dev/null <"$STATE/user_data.pid")
  while [ "${2:-}" = exited ] && [ ! -e "$STATE/user_data.exited" ] && [ ! -e "$STATE/user_data.done" ] &&
    [ -n "$boot" ] && kill -0 "$boot" 2>/dev/null && { [ "$waited" -lt 60 ] || deciding; }; do
    sleep 1
    waited=$((waited + 1))
  done
  if [ "${2:-}" = exited ] && [ -e "$STATE/preempted" ] && [ ! -e "$STATE/watchdog.stop" ]; then notice=1; fi
  if [ "$notice" = 0 ]; then
    if [ "${2:-}" != exited ]; then
      end_life "$1"
    elif [ -e "$STATE/watchdog.stop" ]; then
      end_life "$(head -c 300 "$STATE/watchdog.stop")"
    else
      end_life "the training job exited with $(head -c 20 "$STATE/user_data.exited" 2>/dev/null | tr -cd '0-9')"
    fi
  fi
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    log "SIGTERM to the training job ($pid): it checkpoints and exits; ${GRACE}s grace"
    kill -TERM "$pid" 2>/dev/null
    local waited=0
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$GRACE" ]; do sleep 1; waited=$((waited + 1)); done
    if kill -0 "$pid" 2>/dev/null; then log "the job is still running after ${GRACE}s: SIGKILL"; kill -KILL "$pid"; fi
  fi
  if [ "${SRIFTY_WD_ASG:-0}" = 1 ] && [ "$notice" = 1 ] && [ -z "$HEARTBEAT" ]; then
    # no launcher moves this job: the group replaces the instance, and the replacement resumes from the checkpoint
    # the job just wrote (user_data: SRIFTY_RESUME=latest)
    log "the job left on a notice with a checkpoint: staying in the Auto Scaling group, which starts a replacement"
  elif [ "${SRIFTY_WD_ASG:-0}" = 1 ] && [ -n "${SRIFTY_WD_INSTANCE_ID:-}" ]; then
    local group
    group=$(aws autoscaling describe-auto-scaling-instances --region "$REGION" \
      --instance-ids "$SRIFTY_WD_INSTANCE_ID" --query 'AutoScalingInstances[0].AutoScalingGroupName' --output text)
    if [ -n "$group" ] && [ "$group" != None ]; then
      # the group launches nothing more: its capacity is counted in weighted units (100 per instance), and
      # DetachInstances decrements the desired capacity "by the number of instances detached" (1, API reference), so
      # the group would start a replacement for 99 missing units; then min 0 (the desired capacity may not go below
      # it) and leave with the decrement. The whole fleet is leaving here (the job ended, the launcher is gone, the
      # life cap): a later apply of the root resumes the process (the module suspends none)
      aws autoscaling suspend-processes --region "$REGION" --auto-scaling-group-name "$group" \
        --scaling-processes Launch || log "could not suspend the group's launches"
      aws autoscaling update-auto-scaling-group --region "$REGION" --auto-scaling-group-name "$group" --min-size 0 &&
        aws autoscaling detach-instances --region "$REGION" --auto-scaling-group-name "$group" \
          --instance-ids "$SRIFTY_WD_INSTANCE_ID" --should-decrement-desired-capacity >/dev/null &&
        log "left Auto Scaling group $group (desired capacity decremented)" ||
        log "could not leave Auto Scaling group $group: it may start a replacement, which stops itself the same way"
    fi
  fi
  # the boot script's last words (its log and status record beside the checkpoints: bounded, 5 + 60 + 30 s) before
  # the power goes: shutdown stops every process, an upload in flight included
  waited=0
  while [ -n "$boot" ] && kill -0 "$boot" 2>/dev/null && [ ! -e "$STATE/user_data.done" ] && [ "$waited" -lt 120 ]; do
    sleep 1
    waited=$((waited + 1))
  done
  log "shutdown -h now (the instance terminates on shutdown)"
  shutdown -h now
  exit 0
}

now=$(date +%s)
last_read=$now
max_loops=$(((LIFE_UNTIL - now) / INTERVAL + 2))
[ "$max_loops" -gt 0 ] || max_loops=1
log "watching (every ${INTERVAL}s, at most $max_loops checks; life cap at $LIFE_UNTIL; heartbeat ${HEARTBEAT:-off})"
for ((i = 0; i < max_loops; i++)); do
  now=$(date +%s)
  if job_gone; then stop_instance "the training job has exited" exited; fi
  if [ "$now" -ge "$LIFE_UNTIL" ]; then stop_instance "the fleet's life cap has passed"; fi
  if [ -n "$HEARTBEAT" ]; then
    if beat=$(read_heartbeat); then
      read -r written max_age until <<<"$beat"
      [ "$max_age" = - ] && max_age=$DEFAULT_MAX_AGE
      last_read=$now
      if [ $((now - written)) -gt "$max_age" ]; then
        stop_instance "the launcher's heartbeat is $((now - written))s old (max_age_s $max_age)"
      fi
      if [ "$until" != - ] && [ "$now" -gt "$until" ]; then
        stop_instance "the launcher's max_life_until_unix ($until) has passed"
      fi
    elif [ $((now - last_read)) -gt "$DEFAULT_MAX_AGE" ]; then
      stop_instance "no readable heartbeat at $HEARTBEAT for $((now - last_read))s"
    fi
  fi
  sleep "$INTERVAL"
done
stop_instance "the watchdog's loop bound was reached"
