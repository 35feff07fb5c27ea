# its local rank's: bash sets CUDA_VISIBLE_DEVICES, then becomes python (exec);
# the script then sees one GPU, cuda:0.
