# golden: Whisper large-v3 and large-v3-turbo (config.json sizes) on one H100, fp16/int8_wo/int4_wo, batch 64, prompt 16 of 448 tokens: TensorRT-LLM 1.2.1
# checked against: triton-inference-server/tensorrtllm_backend@v0.17.0, @v0.18.2, @v0.19.0:docs/whisper.md (convert_checkpoint.py --model_dir --output_dir; encoder: trtllm-build --moe_plugin disable --max_batch_size --gemm_plugin disable --bert_attention_plugin float16 --max_input_len 3000 --max_seq_len 3000; decoder: --moe_plugin disable --max_beam_width --max_batch_size --max_seq_len --max_input_len --max_encoder_input_len 3000 --gemm_plugin/--bert_attention_plugin/--gpt_attention_plugin float16)
# checked against: NVIDIA/TensorRT-LLM:examples/models/core/whisper/README.md and convert_checkpoint.py (untagged 2a9abd9: the same two trtllm-build commands; --model_name choices with large-v3-turbo, --dtype, --logits_dtype, --use_weight_only --weight_only_precision int8|int4; reads <model_dir>/<model_name>.pt)
# checked against: trtdeploy/engines/trtllm/releases.py row 1.2 (examples/models/core/<model>/; TensorRT-LLM's own tag not read)
# ---
## large-v3 fp16
# assets: write engines/assets/large-v3.pt (openai-whisper's format), mel_filters.npz and multilingual.tiktoken
python3 /app/tensorrt_llm/examples/models/core/whisper/convert_checkpoint.py --model_dir engines/assets --model_name large-v3 --output_dir trtllm_checkpoint --dtype float16 --logits_dtype float16
trtllm-build --checkpoint_dir trtllm_checkpoint/encoder --output_dir engines/encoder --moe_plugin disable --max_batch_size 64 --gemm_plugin disable --bert_attention_plugin float16 --max_input_len 3000 --max_seq_len 3000
trtllm-build --checkpoint_dir trtllm_checkpoint/decoder --output_dir engines/decoder --moe_plugin disable --max_beam_width 1 --max_batch_size 64 --max_input_len 16 --max_seq_len 448 --max_encoder_input_len 3000 --gemm_plugin float16 --bert_attention_plugin float16 --gpt_attention_plugin float16
# cleanup: remove trtllm_checkpoint/ and engines/assets/large-v3.pt (the engines are built)
## large-v3 int8_wo
# assets: write engines/assets/large-v3.pt (openai-whisper's format), mel_filters.npz and multilingual.tiktoken
python3 /app/tensorrt_llm/examples/models/core/whisper/convert_checkpoint.py --model_dir engines/assets --model_name large-v3 --output_dir trtllm_checkpoint --dtype float16 --logits_dtype float16 --use_weight_only --weight_only_precision int8
trtllm-build --checkpoint_dir trtllm_checkpoint/encoder --output_dir engines/encoder --moe_plugin disable --max_batch_size 64 --gemm_plugin disable --bert_attention_plugin float16 --max_input_len 3000 --max_seq_len 3000
trtllm-build --checkpoint_dir trtllm_checkpoint/decoder --output_dir engines/decoder --moe_plugin disable --max_beam_width 1 --max_batch_size 64 --max_input_len 16 --max_seq_len 448 --max_encoder_input_len 3000 --gemm_plugin float16 --bert_attention_plugin float16 --gpt_attention_plugin float16
# cleanup: remove trtllm_checkpoint/ and engines/assets/large-v3.pt (the engines are built)
## large-v3 int4_wo
# assets: write engines/assets/large-v3.pt (openai-whisper's format), mel_filters.npz and multilingual.tiktoken
python3 /app/tensorrt_llm/examples/models/core/whisper/convert_checkpoint.py --model_dir engines/assets --model_name large-v3 --output_dir trtllm_checkpoint --dtype float16 --logits_dtype float16 --use_weight_only --weight_only_precision int4
trtllm-build --checkpoint_dir trtllm_checkpoint/encoder --output_dir engines/encoder --moe_plugin disable --max_batch_size 64 --gemm_plugin disable --bert_attention_plugin float16 --max_input_len 3000 --max_seq_len 3000
trtllm-build --checkpoint_dir trtllm_checkpoint/decoder --output_dir engines/decoder --moe_plugin disable --max_beam_width 1 --max_batch_size 64 --max_input_len 16 --max_seq_len 448 --max_encoder_input_len 3000 --gemm_plugin float16 --bert_attention_plugin float16 --gpt_attention_plugin float16
# cleanup: remove trtllm_checkpoint/ and engines/assets/large-v3.pt (the engines are built)
## large-v3-turbo fp16
# assets: write engines/assets/large-v3-turbo.pt (openai-whisper's format), mel_filters.npz and multilingual.tiktoken
python3 /app/tensorrt_llm/examples/models/core/whisper/convert_checkpoint.py --model_dir engines/assets --model_name large-v3-turbo --output_dir trtllm_checkpoint --dtype float16 --logits_dtype float16
trtllm-build --checkpoint_dir trtllm_checkpoint/encoder --output_dir engines/encoder --moe_plugin disable --max_batch_size 64 --gemm_plugin disable --bert_attention_plugin float16 --max_input_len 3000 --max_seq_len 3000
trtllm-build --checkpoint_dir trtllm_checkpoint/decoder --output_dir engines/decoder --moe_plugin disable --max_beam_width 1 --max_batch_size 64 --max_input_len 16 --max_seq_len 448 --max_encoder_input_len 3000 --gemm_plugin float16 --bert_attention_plugin float16 --gpt_attention_plugin float16
# cleanup: remove trtllm_checkpoint/ and engines/assets/large-v3-turbo.pt (the engines are built)
## large-v3-turbo int8_wo
# assets: write engines/assets/large-v3-turbo.pt (openai-whisper's format), mel_filters.npz and multilingual.tiktoken
python3 /app/tensorrt_llm/examples/models/core/whisper/convert_checkpoint.py --model_dir engines/assets --model_name large-v3-turbo --output_dir trtllm_checkpoint --dtype float16 --logits_dtype float16 --use_weight_only --weight_only_precision int8
trtllm-build --checkpoint_dir trtllm_checkpoint/encoder --output_dir engines/encoder --moe_plugin disable --max_batch_size 64 --gemm_plugin disable --bert_attention_plugin float16 --max_input_len 3000 --max_seq_len 3000
trtllm-build --checkpoint_dir trtllm_checkpoint/decoder --output_dir engines/decoder --moe_plugin disable --max_beam_width 1 --max_batch_size 64 --max_input_len 16 --max_seq_len 448 --max_encoder_input_len 3000 --gemm_plugin float16 --bert_attention_plugin float16 --gpt_attention_plugin float16
# cleanup: remove trtllm_checkpoint/ and engines/assets/large-v3-turbo.pt (the engines are built)
## large-v3-turbo int4_wo
# assets: write engines/assets/large-v3-turbo.pt (openai-whisper's format), mel_filters.npz and multilingual.tiktoken
python3 /app/tensorrt_llm/examples/models/core/whisper/convert_checkpoint.py --model_dir engines/assets --model_name large-v3-turbo --output_dir trtllm_checkpoint --dtype float16 --logits_dtype float16 --use_weight_only --weight_only_precision int4
trtllm-build --checkpoint_dir trtllm_checkpoint/encoder --output_dir engines/encoder --moe_plugin disable --max_batch_size 64 --gemm_plugin disable --bert_attention_plugin float16 --max_input_len 3000 --max_seq_len 3000
trtllm-build --checkpoint_dir trtllm_checkpoint/decoder --output_dir engines/decoder --moe_plugin disable --max_beam_width 1 --max_batch_size 64 --max_input_len 16 --max_seq_len 448 --max_encoder_input_len 3000 --gemm_plugin float16 --bert_attention_plugin float16 --gpt_attention_plugin float16
# cleanup: remove trtllm_checkpoint/ and engines/assets/large-v3-turbo.pt (the engines are built)
