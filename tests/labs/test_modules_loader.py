"""modules.loader: plausible wrong loaders fail, each the reference (rewritten here with one method
per step, so that one step can be changed) with one step changed; the probe stops a loader that
hangs and kills what a loader leaves running; and the DataLoader timeline renders headless. The
reference and the stub are tested for every exercise in test_exercise_contract.py."""
import itertools
import multiprocessing
import random

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler
from torch.utils.data import default_collate

from grader.checks import run_checks
from labs.modules import probes, viz
from tests.conftest import assert_rejected
from tests.labs._figures import by_gid, render

EX = "modules.loader"
FORK = multiprocessing.get_context("fork")


def fetch(dataset, indices):
    return default_collate([dataset[i] for i in indices])


def work(loader, tasks, results, worker_id, seed):
    loader.seed_worker(seed, worker_id)
    while (task := tasks.get()) is not None:
        idx, indices = task
        try:
            data = fetch(loader.dataset, indices)
        except Exception:
            data = loader.failed(worker_id)
        results.put((idx, data))


class Loader:
    """The reference answer, one method per step."""

    def __init__(self, dataset, batch_size=1, shuffle=False, num_workers=0, generator=None,
                 worker_init_fn=None, drop_last=False, prefetch_factor=2):
        self.dataset, self.workers, self.generator = dataset, num_workers, generator
        self.init_fn, self.prefetch = worker_init_fn, prefetch_factor
        self.drop_last = drop_last
        sampler = (RandomSampler(dataset, generator=generator) if shuffle
                   else SequentialSampler(dataset))
        self.batch_sampler = BatchSampler(sampler, batch_size, drop_last)

    def __len__(self):
        return len(self.batch_sampler)

    def base_seed(self):
        return torch.empty((), dtype=torch.int64).random_(generator=self.generator).item()

    def seeds(self):
        """The sampler's iterator and the base seed, drawn in DataLoader's order."""
        batches = iter(self.batch_sampler)
        return batches, self.base_seed()

    def __iter__(self):
        batches, seed = self.seeds()
        if self.workers == 0:
            return (fetch(self.dataset, b) for b in batches)
        return Epoch(self, batches, seed)

    def seed_worker(self, seed, worker_id):
        random.seed(seed + worker_id)
        torch.manual_seed(seed + worker_id)
        if self.init_fn is not None:
            self.init_fn(worker_id)

    def failed(self, worker_id):
        return ExceptionWrapper(where=f"in worker {worker_id}")

    def reraise(self, data):
        data.reraise()


class Epoch:
    def __init__(self, loader, batches, seed):
        self.loader, self.batches, self.workers = loader, batches, []
        self.results = FORK.Queue()
        self.tasks = self.task_queues(loader.workers)
        for w in range(loader.workers):
            p = FORK.Process(target=work, daemon=True,
                             args=(loader, self.tasks[w], self.results, w, seed))
            p.start()
            self.workers.append(p)
        self.turn = itertools.cycle(range(loader.workers))
        self.sent = self.received = 0
        self.early = {}
        for _ in range(loader.prefetch * loader.workers):
            self.send()

    def task_queues(self, n):
        return [FORK.Queue() for _ in range(n)]

    def queue_for(self, idx):
        return self.tasks[next(self.turn)]

    def send(self):
        indices = next(self.batches, None)
        if indices is not None:
            self.queue_for(self.sent).put((self.sent, indices))
            self.sent += 1

    def __iter__(self):
        return self

    def take(self):
        while self.received not in self.early:
            idx, data = self.results.get()
            self.early[idx] = data
        return self.early.pop(self.received)

    def __next__(self):
        if self.received == self.sent:
            self.close()
            raise StopIteration
        data = self.take()
        self.received += 1
        self.send()
        if isinstance(data, ExceptionWrapper):
            self.loader.reraise(data)
        return data

    def close(self):
        workers, self.workers = getattr(self, "workers", []), []
        for q in getattr(self, "tasks", []):
            q.put(None)
        for p in workers:
            p.join(timeout=1)
            if p.is_alive():
                p.kill()
                p.join()
        for q in [*getattr(self, "tasks", [])] + [getattr(self, "results", None)]:
            if q is not None:
                q.cancel_join_thread()
                q.close()
        self.tasks, self.results = [], None

    def __del__(self):
        self.close()


def loader_with(epoch=Epoch, **methods):
    """Loader with some methods replaced (and its epochs of class ``epoch``)."""

    def __iter__(self):
        batches, seed = self.seeds()
        if self.workers == 0:
            return (fetch(self.dataset, b) for b in batches)
        return epoch(self, batches, seed)

    return type("Wrong", (Loader,), {"__iter__": __iter__, **methods})


def test_the_rewritten_reference_passes():
    v = run_checks(EX, Loader, seed=0, hidden=True)
    assert v.status == "passed", v.message


def test_every_worker_seeded_with_the_same_seed():
    def seed_worker(self, seed, worker_id):
        random.seed(seed)
        torch.manual_seed(seed)
        if self.init_fn is not None:
            self.init_fn(worker_id)

    assert_rejected(EX, loader_with(seed_worker=seed_worker), "differ from those they draw")


def test_base_seed_drawn_after_the_permutation():
    def seeds(self):
        batches = iter(self.batch_sampler)
        first = next(batches, None)  # (the sampler draws its permutation here)
        seed = self.base_seed()
        return itertools.chain([first] if first is not None else [], batches), seed

    assert_rejected(EX, loader_with(seeds=seeds), "draws its base seed from the same generator")


def test_no_base_seed_drawn_without_workers():
    def seeds(self):
        batches = iter(self.batch_sampler)
        return batches, (self.base_seed() if self.workers else 0)

    # the dataset draws from the main process's generator, which the base seed has moved on
    assert_rejected(EX, loader_with(seeds=seeds), "from torch's generator differ")


def test_worker_init_fn_called_before_seeding():
    def seed_worker(self, seed, worker_id):
        if self.init_fn is not None:
            self.init_fn(worker_id)
        random.seed(seed + worker_id)
        torch.manual_seed(seed + worker_id)

    assert_rejected(EX, loader_with(seed_worker=seed_worker), "differ from those they draw")


class CompletionOrder(Epoch):
    def take(self):
        if self.received in self.early:
            return self.early.pop(self.received)
        _, data = self.results.get()
        return data


def test_batches_yielded_as_workers_finish_them():
    assert_rejected(EX, loader_with(CompletionOrder), "It is a later batch")


class FirstFreeWorker(Epoch):
    """One index queue shared by all workers: whoever is free takes the next batch."""

    def task_queues(self, n):
        shared = FORK.Queue()
        return [shared] * n

    def close(self):
        for _ in getattr(self, "workers", []):
            self.tasks[0].put(None)
        self.tasks = self.tasks[:0]
        super().close()


def test_batches_handed_to_the_first_free_worker():
    assert_rejected(EX, loader_with(FirstFreeWorker), "differ from those they draw")


def test_an_error_in_a_worker_swallowed():
    def failed(self, worker_id):
        return {"index": torch.zeros(0, dtype=torch.int64)}

    def reraise(self, data):
        return None

    assert_rejected(EX, loader_with(failed=failed, reraise=reraise),
                    "should raise the UnreadableItem the dataset raised")


def test_an_error_raised_again_as_another_type():
    def reraise(self, data):
        raise RuntimeError(data.exc_msg)

    assert_rejected(EX, loader_with(reraise=reraise), "raise the same type")


class NoShutdownWhenDropped(Epoch):
    def __del__(self):
        pass


def test_workers_left_running_after_an_iterator_is_dropped(monkeypatch):
    monkeypatch.setattr(probes, "LOADER_GRACE", 0.2)  # (how long the check waits for them)
    before = probes.descendants()  # (what earlier tests of this process left running)
    v = assert_rejected(EX, loader_with(NoShutdownWhenDropped), "were still alive")
    assert "after it raised" in v.message and probes.descendants() <= before


def test_drop_last_ignored():
    def __len__(self):
        return -(-len(self.dataset) // self.batch_sampler.batch_size)

    assert_rejected(EX, loader_with(__len__=__len__), "without a short last one (drop_last)")


class Hangs(Epoch):
    def take(self):
        self.results.get()  # (the first result)
        return self.results.get()  # (waits for one more, forever after the last)


def test_a_loader_that_hangs_is_stopped_and_its_workers_killed(monkeypatch):
    monkeypatch.setattr(probes, "LOADER_DEADLINE", 0.5)
    monkeypatch.setattr(probes, "LOADER_GRACE", 0.05)
    before = probes.descendants()  # (what earlier tests of this process left running)
    v = run_checks(EX, loader_with(Hangs), seed=0, hidden=False)
    assert v.status == "failed" and "was still running after" in v.message, v.message
    assert probes.descendants() <= before


def test_the_timeline_draws_a_lane_per_process_and_a_box_per_batch():
    fig = render(viz.loader_timeline(lambda ds: DataLoader(ds, batch_size=2, num_workers=2),
                                     dataset_size=8, ms=1, slow_ms=20))
    ax = fig.axes[0]
    assert len(by_gid(ax.patches, "batch:")) == 4 and len(by_gid(ax.patches, "arrow:")) == 4
    assert len(by_gid(ax.lines, "received:")) == 4
    assert len(by_gid(ax.get_yticklabels(), "lane:")) == 3  # main and two workers
    alone = render(viz.loader_timeline(lambda ds: DataLoader(ds, batch_size=3), dataset_size=6,
                                       ms=1, slow_ms=1))
    ax = alone.axes[0]
    assert len(by_gid(ax.patches, "batch:")) == 2 and not by_gid(ax.patches, "arrow:")
    assert len(by_gid(ax.get_yticklabels(), "lane:")) == 1


def test_the_timeline_stops_a_loader_that_hangs_and_leaves_no_process(monkeypatch):
    """The picture's cell runs the learner's loader outside any check: a loader that never
    ends is stopped, and the worker it started is gone, so that neither costs the exercises
    after it."""
    import multiprocessing
    import time

    import pytest

    from labs.modules import probes, viz

    monkeypatch.setattr(probes, "LOADER_DEADLINE", 0.5)

    class Hangs:
        def __init__(self, dataset):
            self.worker = multiprocessing.get_context("fork").Process(target=time.sleep,
                                                                      args=(30,))

        def __iter__(self):
            self.worker.start()
            while True:
                time.sleep(0.01)

    before = probes.descendants()
    with pytest.raises(TimeoutError, match="had not ended after 0 s"):
        viz.loader_events(Hangs)
    assert probes.descendants() == before
