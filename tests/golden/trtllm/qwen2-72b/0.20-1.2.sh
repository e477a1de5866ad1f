# golden: Qwen2-72B on eight H100, tp4pp2 and tp8pp1: TensorRT-LLM 1.2.1 (and 0.20 to 1.1)
# checked against: NVIDIA/TensorRT-LLM:docs/source/release-notes.md (0.20.0 cites examples/models/core/qwen/README.md; 0.19.0 cites flat paths)
# checked against: triton-inference-server/tensorrtllm_backend dbae4e8 (2025-04-23, after v0.19.0):ci/L0_backend_trtllm/generate_engines.sh (tensorrt_llm/examples/models/core/gpt); TensorRT-LLM's own tags not read
# checked against: NVIDIA/TensorRT-LLM:examples/models/core/qwen/convert_checkpoint.py and README.md (untagged: --use_weight_only --weight_only_precision, --int8_kv_cache, --calib_dataset; INT4-AWQ quantize.py --awq_block_size 128 --calib_size 32)
# ---
## tp4pp2 fp8
python3 /app/tensorrt_llm/examples/quantization/quantize.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype bfloat16 --qformat fp8 --kv_cache_dtype fp8 --calib_size 512 --tp_size 4 --pp_size 2
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --use_fp8_context_fmha enable --workers 8
## tp4pp2 fp16
python3 /app/tensorrt_llm/examples/models/core/qwen/convert_checkpoint.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype float16 --tp_size 4 --pp_size 2 --load_model_on_cpu
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto --workers 8
## tp4pp2 int8_wo
python3 /app/tensorrt_llm/examples/models/core/qwen/convert_checkpoint.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype bfloat16 --tp_size 4 --pp_size 2 --use_weight_only --weight_only_precision int8 --load_model_on_cpu
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto --workers 8
## tp8pp1 fp8
python3 /app/tensorrt_llm/examples/quantization/quantize.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype bfloat16 --qformat fp8 --kv_cache_dtype fp8 --calib_size 512 --tp_size 8 --pp_size 1
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --use_fp8_context_fmha enable --workers 8
## tp8pp1 fp16
python3 /app/tensorrt_llm/examples/models/core/qwen/convert_checkpoint.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype float16 --tp_size 8 --pp_size 1 --load_model_on_cpu
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto --workers 8
## tp8pp1 int8_wo
python3 /app/tensorrt_llm/examples/models/core/qwen/convert_checkpoint.py --model_dir <checkpoint> --output_dir trtllm_checkpoint --dtype bfloat16 --tp_size 8 --pp_size 1 --use_weight_only --weight_only_precision int8 --load_model_on_cpu
trtllm-build --checkpoint_dir trtllm_checkpoint --output_dir engines --max_batch_size 64 --max_input_len 2048 --max_seq_len 3072 --max_num_tokens 16384 --max_beam_width 1 --kv_cache_type paged --gpt_attention_plugin auto --remove_input_padding enable --context_fmha enable --use_paged_context_fmha enable --multiple_profiles enable --gemm_plugin auto --workers 8
