/* cross_entropy.c — being written */
