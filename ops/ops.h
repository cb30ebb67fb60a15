// Every op of libengine in one include.
#pragma once

#include "engine/engine.h"
#include "ops/attention.h"
#include "ops/concat.h"
#include "ops/cross_entropy.h"
#include "ops/dropout.h"
#include "ops/dropout_add_layer_norm.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/gradients.h"
#include "ops/layer_norm.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/relative.h"
#include "ops/rotary.h"
#include "ops/sampling.h"
#include "ops/softmax.h"
