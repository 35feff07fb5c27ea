# in reverse order of the local ranks, as ALCF's set_affinity_gpu_polaris.sh does ("due
# to topology": on Polaris, GPU 3 is the one nearest cores 0-7): bash sets
# CUDA_VISIBLE_DEVICES, then becomes python (exec); the script then sees one GPU, cuda:0.
