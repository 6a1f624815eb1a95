// River side of the side-by-side burn-down (run by benchmarks/scenarios/peers.py).
//
//	riverburn seed <database-url> <jobs>
//	riverburn work <database-url> <jobs>
//	riverburn migrate <database-url>
//	riverburn insert <database-url> <jobs>
//	riverburn version
//
// It does what `river bench -n N` does (the River CLI's benchmark, which the Go module proxy does
// not serve on its own): `seed` migrates River's schema into the database with rivermigrate and
// inserts N no-op jobs with InsertMany in chunks of 5,000, all due now; `work` starts ONE client
// whose default queue has 2,000 workers, FetchCooldown 2 ms and FetchPollInterval 20 ms (the
// values `river bench` chose as its best), works the jobs with a worker that returns at once, and
// exits when all N are completed. Like `river bench`, completion is counted from the client's
// event subscription, which reports a job only after the completer has committed it.
//
// The figure comes from the database's clock, as the other legs' do: from the first claim
// (min(attempted_at), set to the claiming statement's now()) to the database's now() read right
// after the last completion was committed. finalized_at is not used as the end because River
// writes it from the worker's clock when the job returns, up to 250 ms before its completer
// flushes the batch; the finalized_at span is reported alongside for comparison. `work` prints
// a human line and then one JSON line on stdout, which the Python side parses. `migrate` and
// `insert` are `seed` in two steps, for the cost scenario (benchmarks/scenarios/cost.py), which
// counts what the inserts cost the database apart from installing the schema.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// insertChunk is `river bench`'s insertBatchSize: one InsertMany per 5,000 jobs.
const insertChunk = 5_000

// NoopArgs is the job: a counter, as `river bench`'s BenchmarkArgs.
type NoopArgs struct {
	Num int `json:"num"`
}

func (NoopArgs) Kind() string { return "benchmark" }

// NoopWorker returns at once, so what is measured is River's own fetch + complete cycle.
type NoopWorker struct {
	river.WorkerDefaults[NoopArgs]
}

func (w *NoopWorker) Work(ctx context.Context, job *river.Job[NoopArgs]) error { return nil }

// Result is the JSON line of `work`.
type Result struct {
	System             string    `json:"system"`
	Jobs               int       `json:"jobs"`
	Completed          int64     `json:"completed"`
	Seconds            float64   `json:"seconds"`
	JobsPerSecond      float64   `json:"jobs_per_second"`
	FirstAttemptedAt   time.Time `json:"first_attempted_at"`
	LastCompletedAt    time.Time `json:"last_completed_at"`
	FinalizedSeconds   float64   `json:"finalized_span_seconds"`
	JobsPerSecondFinal float64   `json:"jobs_per_second_finalized_at"`
	WallSeconds        float64   `json:"wall_seconds"`
	MaxWorkers         int       `json:"max_workers"`
	FetchCooldownMs    int64     `json:"fetch_cooldown_ms"`
	FetchPollMs        int64     `json:"fetch_poll_interval_ms"`
	River              string    `json:"river"`
	Go                 string    `json:"go"`
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "version" {
		out, _ := json.Marshal(map[string]string{"river": riverVersion(), "go": runtime.Version()})
		fmt.Println(string(out))
		return
	}
	if len(os.Args) == 3 && os.Args[1] == "migrate" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		if err := migrate(ctx, os.Args[2]); err != nil {
			fmt.Fprintf(os.Stderr, "riverburn migrate: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: riverburn seed|work|insert <database-url> <jobs> | riverburn migrate <database-url> | riverburn version")
		os.Exit(2)
	}
	jobs, err := strconv.Atoi(os.Args[3])
	if err != nil || jobs < 1 {
		fmt.Fprintf(os.Stderr, "jobs must be a positive integer, got %q\n", os.Args[3])
		os.Exit(2)
	}
	// SIGTERM (the harness stopping a run that timed out) cancels the run; no JSON line then.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	switch os.Args[1] {
	case "seed":
		if err = migrate(ctx, os.Args[2]); err == nil {
			err = insert(ctx, os.Args[2], jobs)
		}
	case "insert":
		err = insert(ctx, os.Args[2], jobs)
	case "work":
		err = work(ctx, os.Args[2], jobs)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "riverburn %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// riverVersion is the river module version this binary was built with (go.mod pins it).
func riverVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, dep := range info.Deps {
		if dep.Path == "github.com/riverqueue/river" {
			return dep.Version
		}
	}
	return ""
}

// openPool uses pgxpool's defaults, as the River CLI does (max(4, CPUs) connections).
func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	config, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing database URL: %w", err)
	}
	config.ConnConfig.RuntimeParams["application_name"] = "riverburn"
	return pgxpool.NewWithConfig(ctx, config)
}

func logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func migrate(ctx context.Context, url string) error {
	pool, err := openPool(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger()})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	return nil
}

func insert(ctx context.Context, url string, jobs int) error {
	pool, err := openPool(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)

	workers := river.NewWorkers()
	river.AddWorker(workers, &NoopWorker{})
	// An insert-only client: no Queues, so it starts nothing.
	client, err := river.NewClient(driver, &river.Config{Logger: logger(), Workers: workers})
	if err != nil {
		return err
	}
	batch := make([]river.InsertManyParams, 0, insertChunk)
	for done := 0; done < jobs; done += len(batch) {
		batch = batch[:0]
		for i := done; i < min(done+insertChunk, jobs); i++ {
			batch = append(batch, river.InsertManyParams{Args: NoopArgs{Num: i}})
		}
		if _, err := client.InsertMany(ctx, batch); err != nil {
			return fmt.Errorf("inserting: %w", err)
		}
	}
	return nil
}

func work(ctx context.Context, url string, jobs int) error {
	const (
		maxWorkers        = 2_000
		fetchCooldown     = 2 * time.Millisecond
		fetchPollInterval = 20 * time.Millisecond
	)
	pool, err := openPool(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()

	workers := river.NewWorkers()
	river.AddWorker(workers, &NoopWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     fetchCooldown,
		FetchPollInterval: fetchPollInterval,
		Logger:            logger(),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers:           workers,
	})
	if err != nil {
		return err
	}
	// Sized for every job so no event is dropped (a dropped event would never be counted).
	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: max(jobs, 1_000),
		Kinds: []river.EventKind{
			river.EventKindJobCancelled, river.EventKindJobCompleted, river.EventKindJobFailed,
		},
	})
	defer unsubscribe()

	started := time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	}()

	var completed int
	progress := time.NewTicker(2 * time.Second)
	defer progress.Stop()
	for completed < jobs {
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped after %d of %d jobs: %w", completed, jobs, ctx.Err())
		case <-progress.C:
			fmt.Fprintf(os.Stderr, "riverburn: %d of %d completed\n", completed, jobs)
		case event := <-events:
			if event == nil {
				return errors.New("subscription closed before all jobs completed")
			}
			if event.Kind != river.EventKindJobCompleted {
				return fmt.Errorf("job %d: unexpected event %s", event.Job.ID, event.Kind)
			}
			completed++
		}
	}
	wall := time.Since(started)

	// The last completion is committed (its event came after the completer's UPDATE); read the
	// database's clock now, then everything else from the table.
	var res Result
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&res.LastCompletedAt); err != nil {
		return err
	}
	var lastFinalized time.Time
	err = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'completed'), min(attempted_at),
		max(finalized_at) FROM river_job`).
		Scan(&res.Completed, &res.FirstAttemptedAt, &lastFinalized)
	if err != nil {
		return err
	}
	if res.Completed != int64(jobs) {
		return fmt.Errorf("%d events but %d completed rows", jobs, res.Completed)
	}
	res.System, res.Jobs = "river", jobs
	res.Seconds = res.LastCompletedAt.Sub(res.FirstAttemptedAt).Seconds()
	res.JobsPerSecond = round1(float64(jobs) / res.Seconds)
	res.FinalizedSeconds = lastFinalized.Sub(res.FirstAttemptedAt).Seconds()
	res.JobsPerSecondFinal = round1(float64(jobs) / res.FinalizedSeconds)
	res.WallSeconds = wall.Seconds()
	res.MaxWorkers, res.FetchCooldownMs, res.FetchPollMs = maxWorkers, fetchCooldown.Milliseconds(), fetchPollInterval.Milliseconds()
	res.River, res.Go = riverVersion(), runtime.Version()

	fmt.Printf("river %s: %d jobs in %.3f s (database clock) = %.1f jobs/s; to last finalized_at %.1f jobs/s\n",
		res.River, jobs, res.Seconds, res.JobsPerSecond, res.JobsPerSecondFinal)
	line, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Println(string(line))
	return nil
}

func round1(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }
