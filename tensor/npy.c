/* npy.c — being written */
