"""The names a run records (metrics, params): what dashboards, the sweep and ``compare`` read.
No torch and no MLflow here, so every module can import it cheaply."""

from __future__ import annotations

# The tokenizer stage's, per optimizer step: upstream's Comet names (existing dashboards keep working).
TOKENIZER_TRAIN_LOSS = "train_tokenizer_loss_batch"
TOKENIZER_TRAIN_BSQ_LOSS = "train_vqvae_vq_loss_each_batch"
TOKENIZER_TRAIN_RECON_PRE = "train_recon_loss_pre_each_batch"
TOKENIZER_TRAIN_RECON = "train_recon_loss_each_batch"
TOKENIZER_LEARNING_RATE = "tokenizer_learning_rate"
TOKENIZER_STEP_METRICS = (TOKENIZER_TRAIN_LOSS, TOKENIZER_TRAIN_BSQ_LOSS, TOKENIZER_TRAIN_RECON_PRE,
                          TOKENIZER_TRAIN_RECON, TOKENIZER_LEARNING_RATE)

# The predictor stage's, upstream's Comet names (train_predictor.py), and its validation metrics.
PREDICTOR_TRAIN_LOSS = "train_predictor_loss_batch"
PREDICTOR_TRAIN_S1 = "train_S1_loss_each_batch"
PREDICTOR_TRAIN_S2 = "train_S2_loss_each_batch"
PREDICTOR_LEARNING_RATE = "predictor_learning_rate"
# predictor_objective tokens+return: the return head's 1 - correlation, per step and per epoch (all windows)
PREDICTOR_TRAIN_RETURN = "train_return_loss_each_batch"
PREDICTOR_VAL_RETURN = "val_return_loss"
PREDICTOR_VAL_METRIC = "val_predictor_loss_epoch"
PREDICTOR_INITIAL_VAL_METRIC = "val_predictor_loss_initial"
PREDICTOR_TEST_LOSS = "test_predictor_loss"
PREDICTOR_VAL_METRICS = ("val_s1_accuracy", "val_s2_accuracy", "val_s1_perplexity", "val_s2_perplexity")
TOKENIZER_URI_TAG = "tokenizer_uri"
TOKENIZER_RUN_TAG = "tokenizer_run_id"

# The tokenizer's per epoch (step = epoch index) and before training (step 0); the best, at the end.
TOKENIZER_VAL_METRIC = "val_tokenizer_loss_epoch"
TOKENIZER_INITIAL_VAL_METRIC = "val_tokenizer_loss_initial"
BEST_METRIC = "best_val_loss"

# Codebook and reconstruction quality, per epoch (kronos_mlflow.evaluation.quality computes them).
USAGE_FULL = "val_codebook_usage_full"
USAGE_S1 = "val_codebook_usage_s1"
PERPLEXITY_FULL = "val_codebook_perplexity_full"
PERPLEXITY_S1 = "val_codebook_perplexity_s1"
RECON_PRE = "val_recon_loss_pre_epoch"
FEATURE_MSE_PREFIX = "val_mse_"

# Held-out evaluation at the end of a run (kronos_mlflow.evaluation): the best checkpoint's
# metrics on the test windows are TEST_PREFIX + name, the starting weights' BASE_PREFIX +
# TEST_PREFIX + name, and the relative change of the loss with its bootstrap interval.
TEST_PREFIX = "test_"
BASE_PREFIX = "base_"
TOKENIZER_TEST_LOSS = "test_tokenizer_loss"
TOKENIZER_BASE_TEST_LOSS = "base_test_tokenizer_loss"
TEST_LOSS_CHANGE = "test_loss_change"
TEST_WINDOWS = "test_windows"
VERDICT_TAG = "verdict"
VERDICT_BASE_TAG = "verdict_base"
TEST_WINDOWS_DIGEST_TAG = "test_windows_digest"
VERDICTS = ("better", "worse", "inconclusive", "unavailable")
