"""The HyperPyYAML model file read without importing anything it names."""

import pytest
from trtdeploy_cosyvoice.model_yaml import TARGET, read_model_yaml

from trtdeploy import UsageError

DOCUMENT = """\
__set_seed1: !apply:random.seed [1986]
sample_rate: 24000
chunk_size: 25 # tokens
token_mel_ratio: 2
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: 512
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        cfm_params: !new:omegaconf.DictConfig
            content:
                inference_cfg_rate: 0.7
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            channels: [256]
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    sampling_rate: !ref <sample_rate>
    istft_params:
        n_fft: 16
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    fmax: 8000
compute_fbank: !name:cosyvoice.dataset.processor.compute_fbank
    feat_extractor: !ref <feat_extractor>
"""


def test_tags_become_targets_and_references_resolve(tmp_path):
    path = tmp_path / "cosyvoice2.yaml"
    path.write_text(DOCUMENT)
    document = read_model_yaml(path)
    flow = document["flow"]
    estimator = flow["decoder"]["estimator"]
    assert estimator[TARGET] == "cosyvoice.flow.decoder.CausalConditionalDecoder"
    assert estimator["static_chunk_size"] == 50 and estimator["channels"] == [256]
    assert flow["decoder"]["cfm_params"]["content"]["inference_cfg_rate"] == 0.7
    assert document["hift"] == {
        TARGET: "cosyvoice.hifigan.generator.HiFTGenerator",
        "sampling_rate": 24000,
        "istft_params": {"n_fft": 16},
    }
    assert document["compute_fbank"]["feat_extractor"]["fmax"] == 8000  # a reference to a whole object
    assert document["__set_seed1"] == {TARGET: "random.seed", "args": [1986]}  # never called


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("flow: !new:x.Y\n    size: !ref <missing>\n", "names missing"),
        ("a: 1\nflow: !new:x.Y\n    size: !ref <a> ** 2\n", "cannot evaluate"),
        ("- just a list\n", "no top-level mapping"),
        ("flow: [unclosed\n", "cannot read"),
    ],
)
def test_broken_files_are_refused_with_the_reason(tmp_path, text, message):
    path = tmp_path / "cosyvoice2.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        read_model_yaml(path)
