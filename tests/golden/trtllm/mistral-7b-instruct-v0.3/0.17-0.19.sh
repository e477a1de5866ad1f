# golden: mistralai/Mistral-7B-Instruct-v0.3's config.json (MistralForCausalLM on the llama converter, vocab 32768, sliding_window null, bfloat16) on one H100, each precision: TensorRT-LLM 0.17.0.post1, 0.18.2, 0.19.0
# checked against: NVIDIA/TensorRT-LLM:examples/llama/convert_checkpoint.py (untagged 05316d3, the flat layout: --model_dir, --output_dir, --dtype, --tp_size, --pp_size, --use_weight_only, --weight_only_precision int8|int4, --int8_kv_cache, --calib_dataset, --load_model_on_cpu)
# checked against: quantize.py's flags as in the Qwen golden files of the same releases (one-h100/)
# ---
## bf16
python3 /app/tensorrt_llm/examples/llama/convert_checkpoint.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype bfloat16 --tp_size 1 --pp_size 1
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto
## fp16
python3 /app/tensorrt_llm/examples/llama/convert_checkpoint.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype float16 --tp_size 1 --pp_size 1
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto
## fp8
python3 /app/tensorrt_llm/examples/quantization/quantize.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype bfloat16 --qformat fp8 --kv_cache_dtype fp8 --calib_size 512 --tp_size 1 --pp_size 1
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --use_fp8_context_fmha enable
## int8_wo
python3 /app/tensorrt_llm/examples/llama/convert_checkpoint.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype bfloat16 --tp_size 1 --pp_size 1 --use_weight_only --weight_only_precision int8
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto
## int4_wo
python3 /app/tensorrt_llm/examples/llama/convert_checkpoint.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype bfloat16 --tp_size 1 --pp_size 1 --use_weight_only --weight_only_precision int4
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto
## int4_awq
python3 /app/tensorrt_llm/examples/quantization/quantize.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype bfloat16 --qformat int4_awq --awq_block_size 128 --calib_size 32 --tp_size 1 --pp_size 1
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto
## int8_sq
python3 /app/tensorrt_llm/examples/quantization/quantize.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype bfloat16 --qformat int8_sq --calib_size 512 --tp_size 1 --pp_size 1
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto
