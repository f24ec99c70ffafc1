"""Probes at the same rate within one session: how much p99 TTFT moves when only the machine
(new: one schedule) or the machine and the Poisson draw (old: a draw per probe) differ."""
import collections, gzip, json, math, statistics, sys, glob
pool = collections.defaultdict(list)
for f in sorted(glob.glob('results-*.json.gz')):
    method = 'one schedule (new)' if 'new' in f else 'a draw per probe (old)'
    d = json.load(gzip.open(f))['results'][0]
    by_rate = collections.defaultdict(list)
    for r in d['search_runs']:
        for p in r['probes']:
            t = p['summary']['ttft']['p99_ms']
            if p['summary'].get('aborted_early') or t is None or not math.isfinite(t):
                continue
            by_rate[round(p['rate'], 2)].append(math.log(t))
    for rate, logs in by_rate.items():
        if len(logs) >= 2:
            m = statistics.fmean(logs)
            pool[method] += [(x - m) ** 2 for x in logs]
            pool[method + ' n'] += [len(logs) - 1]
for method in ('a draw per probe (old)', 'one schedule (new)'):
    sq, dof = sum(pool[method]), sum(pool[method + ' n'])
    print(f'{method}: pooled sd of log p99 TTFT between replicate probes = '
          f'{100 * math.sqrt(sq / dof):.0f} % ({dof} degrees of freedom)')
