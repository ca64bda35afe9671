"""Which workers the demo starts together: engines on one GPU one after the other (vLLM would count a
neighbour's allocations while profiling as its own), everything at once on CPU. Pure logic, no vLLM."""

from hybrid_pd.prefill.dev.demo import build_children, parse_args, start_waves


def names(waves):
    return [[c.name for c in wave] for wave in waves]


def waves_for(tmp_path, *argv):
    args = parse_args(["--logs", str(tmp_path), "--reference", *argv])
    return names(start_waves(build_children(args)[:-1], args))


def test_two_gpus_the_reference_waits_for_the_decoder_it_shares_a_gpu_with(tmp_path):
    assert waves_for(tmp_path, "--device", "gpu") == [["prefill", "decode"], ["reference"]]


def test_one_gpu_every_engine_starts_alone(tmp_path):
    assert waves_for(tmp_path, "--device", "gpu", "--prefill-gpu", "0", "--decode-gpu", "0") == [
        ["prefill"], ["decode"], ["reference"]]


def test_cpu_engines_start_together(tmp_path):
    assert waves_for(tmp_path, "--device", "cpu") == [["prefill", "decode", "reference"]]
