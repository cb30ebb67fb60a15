// Every op of libengine in one include.
#pragma once

#include "engine/engine.h"
#include "ops/elementwise.h"
#include "ops/dropout.h"
#include "ops/layer_norm.h"
#include "ops/softmax.h"
