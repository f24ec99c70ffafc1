import gzip, json, math, statistics, sys, glob
for f in sorted(glob.glob('results-*.json.gz')):
    d = json.load(gzip.open(f))['results'][0]
    runs = d['search_runs']
    g = [r['metrics']['slo_goodput_tok_s'] for r in runs if r.get('metrics',{}).get('slo_goodput_tok_s')]
    rate = [r['metrics']['slo_rate_rps'] for r in runs if r.get('metrics',{}).get('slo_rate_rps')]
    conv = [r['converged'] for r in runs]
    nprobes = [len(r['probes']) for r in runs]
    lg = [math.log(x) for x in g]
    cv = statistics.stdev(lg) if len(lg) > 1 else float('nan')
    print(f.split('/')[-1], 'goodput', [round(x) for x in g], 'rate', [round(x,2) for x in rate], 'lo', [round(r['bracket'][0] or 0,2) for r in runs], 'hi', [round(r['bracket'][1] or 0,2) for r in runs], 'conv', conv, 'probes', nprobes, 'sd(log goodput)=%.1f%%' % (100*cv))
