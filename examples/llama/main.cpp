// build/bin/llama: fine-tune a Hugging Face Llama checkpoint (llama.cpp: the flags; train.cpp: the run).
#include "llama/train.h"

int main(int argc, char** argv) { return llama::run(argc, argv); }
