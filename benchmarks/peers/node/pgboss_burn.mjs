// pg-boss side of the side-by-side burn-down (run by benchmarks/scenarios/peers.py).
//
//   node pgboss_burn.mjs seed <socket-dir> <database> <jobs>
//   node pgboss_burn.mjs work <socket-dir> <database> <batchSize> <localConcurrency>
//   node pgboss_burn.mjs migrate <socket-dir> <database>
//   node pgboss_burn.mjs insert <socket-dir> <database> <jobs>
//   node pgboss_burn.mjs clean <socket-dir> <database>
//
// `seed` installs pg-boss's schema, creates the queue and inserts the jobs in chunks of 1,000
// (boss.insert, one statement per chunk), all due now. `work` runs until SIGTERM with a handler
// that returns at once, so what is measured is pg-boss's own fetch + complete cycle: fetches of
// `batchSize` jobs, burst mode while batches come back full (no poll delay), completion of the
// whole batch in one call. The harness reads started_on / completed_on from pgboss.job.
// `migrate` and `insert` are `seed` in two steps, for the cost scenario (benchmarks/scenarios/
// cost.py), which counts what the inserts cost the database apart from installing the schema.
// `clean` deletes the queue's finished jobs with boss.deleteStoredJobs: the same batched walk
// (10,000 keys a statement) as the maintenance's deletion of jobs past their retention (7 days by
// default), for the cost scenario's retention leg.
import { PgBoss } from 'pg-boss';

const [mode, host, database, a, b] = process.argv.slice(2);
const QUEUE = 'bench';

function boss(extra = {}) {
  // host is the Unix socket directory of the embedded PostgreSQL (node-postgres accepts it).
  const instance = new PgBoss({
    host, database, user: 'postgres', max: 4,
    schedule: false, supervise: false, migrate: mode === 'seed' || mode === 'migrate', ...extra,
  });
  instance.on('error', (err) => console.error('pg-boss error', err));
  return instance;
}

async function insert(b0, jobs) {
  for (let done = 0; done < jobs; done += 1000) {
    const chunk = [];
    for (let i = done; i < Math.min(done + 1000, jobs); i++) chunk.push({ data: { n: i } });
    await b0.insert(QUEUE, chunk);
  }
}

if (mode === 'seed' || mode === 'migrate' || mode === 'insert') {
  const b0 = boss();
  await b0.start();
  if (mode !== 'insert') await b0.createQueue(QUEUE);
  if (mode !== 'migrate') await insert(b0, Number(a));
  await b0.stop({ graceful: false, close: true });
} else if (mode === 'clean') {
  const b0 = boss();
  await b0.start();
  await b0.deleteStoredJobs(QUEUE);
  await b0.stop({ graceful: false, close: true });
} else if (mode === 'work') {
  const batchSize = Number(a);
  const localConcurrency = Number(b);
  const b0 = boss({ max: localConcurrency + 2 });
  await b0.start();
  await b0.work(
    QUEUE,
    { batchSize, localConcurrency, pollingIntervalSeconds: 0.5, burstWhenBatchFull: true },
    async (jobs) => jobs.length,
  );
  const stop = async () => {
    await b0.stop({ graceful: true, close: true, timeout: 5000 });
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  console.error('pg-boss worker ready');
} else {
  console.error('usage: pgboss_burn.mjs seed|work|migrate|insert|clean ...');
  process.exit(2);
}
