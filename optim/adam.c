/* adam.c — being written */
