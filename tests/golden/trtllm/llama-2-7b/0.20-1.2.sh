# golden: meta-llama/Llama-2-7b-hf's config.json (LlamaForCausalLM, 32 KV heads, vocab 32000, float16: the quantized precisions get float16 activations) on one H100, each precision: TensorRT-LLM 0.20.0, 0.21.0, 1.0.0, 1.1.0, 1.2.1
# checked against: NVIDIA/TensorRT-LLM:examples/models/core/llama/convert_checkpoint.py (untagged 368f8f2: the same flags; --dtype also takes auto); docs/source/release-notes.md (0.20.0 moves the converters to examples/models/core/<model>/)
# checked against: quantize.py's flags as in the Qwen golden files of the same releases (one-h100/)
# ---
## bf16
python3 /app/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype bfloat16 --tp_size 1 --pp_size 1
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto
## fp16
python3 /app/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype float16 --tp_size 1 --pp_size 1
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto
## fp8
python3 /app/tensorrt_llm/examples/quantization/quantize.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype float16 --qformat fp8 --kv_cache_dtype fp8 --calib_size 512 --tp_size 1 --pp_size 1
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --use_fp8_context_fmha enable
## int8_wo
python3 /app/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype float16 --tp_size 1 --pp_size 1 --use_weight_only --weight_only_precision int8
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto
## int4_wo
python3 /app/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype float16 --tp_size 1 --pp_size 1 --use_weight_only --weight_only_precision int4
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto
## int4_awq
python3 /app/tensorrt_llm/examples/quantization/quantize.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype float16 --qformat int4_awq --awq_block_size 128 --calib_size 32 --tp_size 1 --pp_size 1
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto
## int8_sq
python3 /app/tensorrt_llm/examples/quantization/quantize.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype float16 --qformat int8_sq --calib_size 512 --tp_size 1 --pp_size 1
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto
