# Sourced by bench/train_real_text.sh and bench/train_fp16.sh: the gpt2-124m run on real text they
# share (one GPU; GPT-2's learning-rate recipe), as the array `real_text_run`, for the data prefix
# in $data.
real_text_run=(--model gpt2-124m --vocab-size 50257 --device cuda --data-path "$data" --split 949,50,1 --mbs 16
               --gbs 32 --lr 6e-4 --min-lr 6e-5 --lr-warmup-iters 30 --lr-decay-style cosine --weight-decay 0.1
               --adam-beta2 0.95 --clip-grad 1.0 --seed 1234)
