"""Pure decisions, over raytrain.spec values and raytrain.catalog's hardware and prices. No
torch, Ray, boto3, httpx, clock or environment: every function here is a function of its
arguments, so it is tested with plain values.

- lifecycle/: a job's life, (record, event, now) -> (record, effects, reply);
- resolve.py: a job's layout and plan, decided once and stored with it;
- planner.py and cost_model.py: every feasible layout with its predicted time, memory, cost;
- capacity.py: admission and backfill of queued jobs on a fixed cluster;
- autoscale.py, engine.py, throughput.py, offers.py: the spot/on-demand policy, one job's
  capacity engine over it (fed events by the live service and the simulator alike), what a
  job makes of an offer, the policy's rankings;
- fleet.py, simulate.py, hindsight.py: spot-fleet traces, their replays under each strategy,
  and the hindsight-optimal schedule (numpy: array arithmetic only);
- batching.py, schedule.py: which samples each rank reads, and the learning-rate schedule.
"""
